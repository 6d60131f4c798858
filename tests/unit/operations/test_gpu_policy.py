"""GPU policy: settings, the GPU's state read from a recorded real H100's nvidia-smi output,
the checks against what the GPU allows, the deploy's plan, and the unit's script run for real
against the lab's STAND-IN nvidia-smi (the lab has no GPU) in a private mount namespace."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import dgxos
from sparkrig import gpu
from sparkrig.operations import gpu_policy as gp
from sparkrig.operations.gpu_policy import deploy as gp_deploy
from sparkrig.resources import TEMPLATES
from sparkrig.settings import defaults, problems
from tests.compliance import test_gpu_policy as controls
from tests.unit.pyinfra_fake import HOST_STATE, execute, host_state

DATA = Path(__file__).parent / "data" / "gpu_policy"
# Recorded real-device output: an H100 (not a GB10), driver 580.159.04, read-only (README.md there).
REAL_H100_LINE = (DATA / "recorded-real-h100-query-gpu.csv").read_text()
REAL_H100_UNKNOWN_FIELD = (DATA / "recorded-real-h100-unknown-field.txt").read_text()
QUERY = "--query-gpu="  # the GpuState fact's command holds it


def fact_output(
    query: str = REAL_H100_LINE, status: int = 0, field: str = gpu.REASON_FIELDS[0], applied: str = ""
) -> list[str]:
    """What GpuState's command prints (sparkrig.gpu.script)."""
    return [f"## query {status} {field}", *query.splitlines(), "## applied", *applied.splitlines()]


REAL_H100 = gpu.parse(fact_output())


# Settings --------------------------------------------------------------------


def test_defaults_are_valid_and_off():
    assert problems(gp.SETTINGS, {}) == []
    assert not gp_deploy.set_anywhere(defaults(gp.SETTINGS))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"gpu_persistence": "yes"}, "gpu_persistence = 'yes': allowed is True or False"),
        (
            {"gpu_clock_max_mhz": "2100"},
            "gpu_clock_max_mhz = '2100': allowed is None (leave it alone), an integer from 200 to 5000 (MHz)",
        ),
        ({"gpu_clock_max_mhz": 100}, "an integer from 200 to 5000 (MHz)"),
        ({"gpu_clock_max_mhz": True}, "an integer from 200 to 5000"),
        (
            {"gpu_power_limit_w": 5000},
            "gpu_power_limit_w = 5000: allowed is None (leave it alone), an integer from 10 to 2000 (watts)",
        ),
        ({"gpu_clock_max_mhz": {"gb11": 2100}}, "bad entry: 'gb11': 2100"),
        ({"gpu_clock_max_mhz": {"auto": 2100}}, "bad entry: 'auto': 2100"),
        ({"gpu_power_limit_w": {"hopper": 1.5}}, "bad entry: 'hopper': 1.5"),
        ({"gpu_clock_max": 2100}, "not a sparkrig setting (did you mean gpu_clock_max_mhz?)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(gp.SETTINGS + __import__("sparkrig.operations.hardware", fromlist=["x"]).SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


def test_per_profile_values():
    assert gp.settings.for_profile({"gb10": 2100, "hopper": None}, "gb10") == 2100
    assert gp.settings.for_profile({"gb10": 2100}, "rtx50") is None
    assert gp.settings.for_profile(1500, "rtx50") == 1500
    assert gp_deploy.set_anywhere({**defaults(gp.SETTINGS), "gpu_clock_max_mhz": {"gb10": 2100}})
    assert not gp_deploy.set_anywhere({**defaults(gp.SETTINGS), "gpu_clock_max_mhz": {"gb10": None}})


# The GPU's state: recorded real H100 output --------------------------------------


def test_real_h100_output_is_read():
    (h100,) = REAL_H100["gpus"]
    assert REAL_H100["problem"] is None and REAL_H100["reasons_field"] == "clocks_event_reasons.active"
    assert {k: v for k, v in h100.items() if k != "raw"} == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "persistence": True,
        "clocks_sm_mhz": 345.0,
        "clocks_max_sm_mhz": 1980.0,
        "power_draw_w": 72.62,
        "power_limit_w": 700.0,
        "power_min_limit_w": 200.0,
        "power_max_limit_w": 700.0,
        "power_default_limit_w": 700.0,
        "temperature_c": 40.0,
        "reasons": ["gpu_idle"],
    }
    assert REAL_H100["applied"] is None


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "gpu_clock_max_mhz",
            2100,
            "gpu_clock_max_mhz = 2100: allowed on GPU 0 (NVIDIA H100 80GB HBM3) is 200 to 1980 MHz",
        ),
        ("gpu_clock_max_mhz", 1500, None),
        ("gpu_power_limit_w", 800, "gpu_power_limit_w = 800: allowed on GPU 0 (NVIDIA H100 80GB HBM3) is 200 to 700 W"),
        ("gpu_power_limit_w", 150, "gpu_power_limit_w = 150: allowed on GPU 0 (NVIDIA H100 80GB HBM3) is 200 to 700 W"),
        ("gpu_power_limit_w", 500, None),
    ],
)
def test_values_checked_against_what_the_real_h100_allows(key, value, expected):
    assert gpu.out_of_range(key, value, REAL_H100["gpus"]) == expected


def test_a_gpu_without_a_power_range_refuses_a_power_limit():
    line = "0, NVIDIA GB10, Enabled, 2100, 3003, [N/A], [N/A], [N/A], [N/A], [N/A], 45, 0x0000000000000000"
    found = gpu.out_of_range("gpu_power_limit_w", 100, gpu.parse(fact_output(line))["gpus"])
    assert found.startswith(
        "gpu_power_limit_w = 100: GPU 0 (NVIDIA GB10) reports no range to set it in "
        "(power.min_limit/power.max_limit is [N/A])"
    )


def test_reasons_bits_are_named():
    assert gpu.reasons("0x0000000000000044") == ["sw_power_cap", "hw_thermal_slowdown"]
    assert gpu.reasons("0x0000000000001000") == ["unknown_0x1000"]
    assert gpu.reasons("[N/A]") is None


def test_a_failed_query_is_a_problem_not_a_gpu():
    found = gpu.parse(["## query 9 clocks_throttle_reasons.active", "No devices were found", "## applied"])
    assert found["gpus"] == [] and found["problem"] == "nvidia-smi's query failed (exit 9): No devices were found"
    assert gpu.parse(["## none"])["problem"] == "no nvidia-smi on the host (no NVIDIA driver)"


def test_output_that_is_not_nvidia_smis_is_refused():
    with pytest.raises(ValueError, match="expected 12 fields"):
        gpu.parse(fact_output("0, H100, Enabled"))
    with pytest.raises(ValueError, match="not a line of the unit's record"):
        gpu.parse(fact_output(applied="boot x\nrm -rf / ok"))


# The read-only controls' logic against the real H100's state ------------------------


def test_controls_pass_on_the_real_h100_as_it_is():
    assert controls.persistence_problems(REAL_H100) == []
    assert controls.power_problems(700, REAL_H100) == []
    assert controls.thermal_problems(REAL_H100) == []


def test_controls_name_expected_and_actual():
    assert controls.power_problems(500, REAL_H100) == [
        "GPU 0 (NVIDIA H100 80GB HBM3): power limit expected 500 W, is 700 W"
    ]
    # No unit ran on the lent machine: its cap is not this boot's.
    assert controls.clock_problems(1500, REAL_H100, "b1") == [
        "SM clock cap expected 1500 MHz applied this boot, "
        "but the unit's record is missing (/run/sparkrig/gpu-policy.applied)"
    ]
    hot = gpu.parse(fact_output(REAL_H100_LINE.replace("0x0000000000000001", "0x0000000000000040")))
    assert controls.thermal_problems(hot) == [
        "GPU 0 (NVIDIA H100 80GB HBM3): expected no heat or power-brake slowdown, "
        "active: hw_thermal_slowdown at 40.0 °C"
    ]
    capped = gpu.parse(fact_output(applied="boot b1\nclock_max_mhz 300 ok"))
    assert controls.clock_problems(300, capped, "b1") == [
        "GPU 0 (NVIDIA H100 80GB HBM3): SM clock expected at most 300 MHz, is 345 MHz"
    ]
    assert controls.clock_problems(1500, gpu.parse(fact_output(applied="boot b1\nclock_max_mhz 1500 ok")), "b1") == []
    assert controls.clock_problems(1500, gpu.parse(fact_output(applied="boot b0\nclock_max_mhz 1500 ok")), "b1")


# The deploy's plan --------------------------------------------------------------------

POLICY = {"gpu_persistence": True, "gpu_clock_max_mhz": 1500, "gpu_power_limit_w": 500}
WANTED = {"persistence": True, "clock_max_mhz": 1500, "power_limit_w": 500}


def _host(files: bool = True, enabled: bool = True, query: str = REAL_H100_LINE, applied: str = "") -> dict:
    texts = {
        gp_deploy.SCRIPT: (gp_deploy.render_script(), 0o755),
        gp_deploy.ENV_FILE: gp_deploy.render_env(WANTED),
        gp_deploy.UNIT_FILE: gp_deploy.render_unit(),
    }
    return {
        HOST_STATE: host_state(
            files={p: (t if files else None) for p, t in texts.items()}, units={gp_deploy.UNIT: (enabled, enabled)}
        ),
        QUERY: fact_output(query.replace("700.00, 200.00", "500.00, 200.00", 1), applied=applied),
    }


APPLIED = "boot b1\npersistence 1 ok\nclock_max_mhz 1500 ok\npower_limit_w 500 ok"


def test_first_run_writes_enables_and_applies():
    ops = execute(gp.gpu_policy, data=POLICY, responses=_host(files=False, enabled=False))
    names = [op.name for op in ops]
    assert any("/usr/local/sbin/sparkrig-gpu-policy" in n for n in names)
    env = next(op for op in ops if "/etc/sparkrig/gpu-policy.env" in op.name)
    assert env.uploads == {"/etc/sparkrig/.gpu-policy.env.sparkrig-new": gp_deploy.render_env(WANTED).encode()}
    assert "GPU_CLOCK_MAX_MHZ=1500\nGPU_POWER_LIMIT_W=500\n" in gp_deploy.render_env(WANTED)
    assert any("runs at every boot" in n for n in names)
    apply = next(op for op in ops if "Apply the GPU policy now" in op.name)
    assert apply.commands[0].startswith("systemctl restart sparkrig-gpu-policy.service || { journalctl")


def test_second_run_changes_nothing():
    assert execute(gp.gpu_policy, data=POLICY, responses=_host(applied=APPLIED)) == []


def test_a_lost_setting_is_applied_again():
    ops = execute(gp.gpu_policy, data=POLICY, responses=_host(applied=APPLIED.replace("power_limit_w 500 ok", "")))
    assert [op.name for op in ops] == [
        "GPU policy | Apply the GPU policy now (power_limit_w 500 not applied this boot)"
    ]
    reset = _host(applied=APPLIED)
    reset[QUERY] = fact_output(REAL_H100_LINE, applied=APPLIED)  # someone set 700 W since
    ops = execute(gp.gpu_policy, data=POLICY, responses=reset)
    assert [op.name for op in ops] == ["GPU policy | Apply the GPU policy now (GPU 0 power limit 700.0 W)"]


def test_a_value_the_gpu_does_not_allow_fails_the_host_before_any_change():
    ops = execute(
        gp.gpu_policy, data={**POLICY, "gpu_clock_max_mhz": 2100}, responses=_host(files=False, enabled=False)
    )
    assert [op.name for op in ops] == ["GPU policy | The GPU policy fits what the GPU allows"]
    assert "gpu_clock_max_mhz = 2100: allowed on GPU 0 (NVIDIA H100 80GB HBM3) is 200 to 1980 MHz" in ops[0].commands[0]


def test_no_gpu_fails_the_host_saying_why():
    responses = _host(files=False, enabled=False)
    responses[QUERY] = ["## none"]
    ops = execute(gp.gpu_policy, data=POLICY, responses=responses)
    assert "no nvidia-smi on the host" in ops[0].commands[0]


def test_per_profile_value_follows_the_hosts_profile():
    data = {"gpu_clock_max_mhz": {"hopper": 1500}, "hardware_profile": "hopper"}
    ops = execute(gp.gpu_policy, data=data, responses=_host(files=False, enabled=False))
    env = next(op for op in ops if "/etc/sparkrig/gpu-policy.env" in op.name)
    assert b"GPU_CLOCK_MAX_MHZ=1500\n" in next(iter(env.uploads.values()))
    # Another profile's hosts: nothing set, nothing done.
    assert (
        execute(gp.gpu_policy, data={**data, "hardware_profile": "gb10"}, responses=_host(files=False, enabled=False))
        == []
    )


def test_off_disables_a_unit_left_enabled():
    ops = execute(gp.gpu_policy, responses=_host())
    assert [op.name for op in ops] == ["GPU policy | sparkrig-gpu-policy.service is disabled (no GPU policy set)"]
    assert execute(gp.gpu_policy, responses=_host(files=False, enabled=False)) == []


# The unit's script, run for real against the lab's stand-in nvidia-smi ------------------

SCRIPT = TEMPLATES / "gpu_policy" / "sparkrig-gpu-policy.sh"


def _private_run(tmp_path: Path, gpu_answer: str, env: dict[str, str], then: str = "", old_driver: bool = False):
    """The unit's script as root with the STAND-IN nvidia-smi first on PATH, in a private mount
    namespace whose /run and /var/lib are fresh (nothing of this machine's is touched); then
    ``then`` (shell) in the same namespace. Needs root and unshare (the tests' CI runs as root)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("running the unit's script needs root and unshare (a private /run)")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    standin = dgxos.nvidia_smi_standin(gpu_answer)
    if old_driver:
        standin = standin.replace("#!/bin/sh\n", "#!/bin/sh\nOLD_DRIVER=1\n", 1)
    (bindir / "nvidia-smi").write_text(standin)
    (bindir / "nvidia-smi").chmod(0o755)
    inner = f'mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /var/lib && sh {SCRIPT}; echo "script-exit $?"; {then}'
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", inner],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin", **env},
    )


def test_script_applies_and_records_and_the_fact_reads_it(tmp_path):
    result = _private_run(
        tmp_path,
        "12.0, NVIDIA GeForce RTX 5070 Ti",
        {"GPU_PERSISTENCE": "1", "GPU_CLOCK_MAX_MHZ": "2100", "GPU_POWER_LIMIT_W": "280"},
        then=f"cat {dgxos.STANDIN_CALLS}; echo '### fact'; sh -c {shlex.quote(gpu.script())}",
    )
    assert "script-exit 0" in result.stdout, result.stdout + result.stderr
    calls, fact = result.stdout.split("### fact\n")
    assert [line.split(" ", 2)[2] for line in calls.splitlines() if "uid=0" in line] == [
        "-pm 1",
        "-lgc 0,2100",
        "-pl 280",
    ]
    state = gpu.parse(fact.splitlines())
    (card,) = state["gpus"]
    assert (card["persistence"], card["clocks_sm_mhz"], card["power_limit_w"]) == (True, 2100.0, 280.0)
    assert state["applied"]["settings"] == {
        "persistence": {"value": 1, "ok": True, "exit": 0},
        "clock_max_mhz": {"value": 2100, "ok": True, "exit": 0},
        "power_limit_w": {"value": 280, "ok": True, "exit": 0},
    }
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert state["applied"]["boot"] == boot
    assert controls.clock_problems(2100, state, boot) == [] and controls.power_problems(280, state) == []


def test_script_reports_an_unsupported_setting_and_fails(tmp_path):
    """GB10's stand-in refuses -pl as unsupported (exit 3): the script says so, records it,
    still applies the rest, and exits non-zero (the unit fails)."""
    result = _private_run(
        tmp_path,
        "12.1, NVIDIA GB10",
        {"GPU_CLOCK_MAX_MHZ": "2100", "GPU_POWER_LIMIT_W": "100"},
        then=f"cat {gpu.APPLIED}",
    )
    assert "script-exit 1" in result.stdout, result.stdout + result.stderr
    assert (
        "sparkrig-gpu-policy: power_limit_w 100: NOT applied: nvidia-smi -pl 100 exited 3: "
        "Changing power management limit is not supported"
    ) in result.stdout
    assert "nvidia-smi's exit 3 means this GPU does not support it" in result.stdout
    assert "clock_max_mhz 2100 ok\npower_limit_w 100 failed 3\n" in result.stdout


@pytest.mark.parametrize("value", ["21x0", "2100;reboot", "-1"])
def test_script_refuses_a_value_that_is_not_a_number(tmp_path, value):
    result = _private_run(
        tmp_path,
        "12.0, NVIDIA GeForce RTX 5070 Ti",
        {"GPU_CLOCK_MAX_MHZ": value},
        then=f"cat {dgxos.STANDIN_CALLS} 2>/dev/null",
    )
    assert "script-exit 2" in result.stdout and "is not a whole number: nothing applied" in result.stdout
    assert "uid=0" not in result.stdout  # nvidia-smi was never asked to set anything


def test_fact_falls_back_to_the_old_reasons_field(tmp_path):
    """A driver before 535 knows only clocks_throttle_reasons (the real 580 says exit 2 for a
    field it does not know, as recorded)."""
    assert REAL_H100_UNKNOWN_FIELD.startswith('Field "no.such.field" is not a valid field to query.')
    result = _private_run(
        tmp_path,
        "12.0, NVIDIA GeForce RTX 5070 Ti",
        {},
        old_driver=True,
        then=f"echo '### fact'; sh -c {shlex.quote(gpu.script())}",
    )
    state = gpu.parse(result.stdout.split("### fact\n")[1].splitlines())
    assert state["problem"] is None and state["reasons_field"] == "clocks_throttle_reasons.active"
    assert state["gpus"][0]["reasons"] == []


# The query is bounded and runs from / ------------------------------------------------

# A STAND-IN for an nvidia-smi whose driver hangs (the lab has no GPU): it answers after 30 s,
# naming its working directory as the GPU's name.
HANGING = """#!/bin/sh
sleep "${HANG_S:-0}"
echo "0, $(pwd), Enabled, 300, 2000, 50.00, 300.00, 100.00, 400.00, 300.00, 40, 0x0000000000000000"
"""


def _query_with(tmp_path: Path, hang_s: int, timeout_s: int, monkeypatch) -> tuple[dict, float]:
    import time  # noqa: PLC0415

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "nvidia-smi").write_text(HANGING)
    (bindir / "nvidia-smi").chmod(0o755)
    monkeypatch.setattr(gpu, "QUERY_TIMEOUT_S", timeout_s)
    started = time.monotonic()
    result = subprocess.run(
        ["sh", "-c", gpu.script()],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": f"{bindir}:/usr/bin:/bin", "HANG_S": str(hang_s)},
    )
    return gpu.parse(result.stdout.splitlines()), time.monotonic() - started


def test_the_query_runs_from_slash(tmp_path, monkeypatch):
    state, _ = _query_with(tmp_path, 0, 5, monkeypatch)
    assert state["gpus"][0]["name"] == "/"


def test_a_hanging_nvidia_smi_is_cut_off(tmp_path, monkeypatch):
    state, took = _query_with(tmp_path, 30, 1, monkeypatch)
    assert took < 10
    assert state["gpus"] == [] and state["problem"].startswith("nvidia-smi's query failed (exit 124)")


# The files are validated before they take effect ----------------------------------


def _validates(validator: tuple[str, ...], text: str, tmp_path: Path) -> bool:
    path = tmp_path / "candidate"
    path.write_text(text)
    return subprocess.run([*validator, str(path)], capture_output=True).returncode == 0


def test_env_and_unit_files_are_validated_before_they_take_effect(tmp_path):
    env = gp_deploy.render_env(WANTED)
    assert _validates(gp_deploy.ENV_VALIDATOR, env, tmp_path)
    assert not _validates(gp_deploy.ENV_VALIDATOR, env + "GPU_CLOCK_MAX_MHZ=$(reboot)\n", tmp_path)
    assert not _validates(gp_deploy.ENV_VALIDATOR, env.replace("=500", "=5OO"), tmp_path)
    unit = gp_deploy.render_unit()
    assert _validates(gp_deploy.UNIT_VALIDATOR, unit, tmp_path)
    assert not _validates(gp_deploy.UNIT_VALIDATOR, unit + "ExecStartPre=/tmp/x\n", tmp_path)
    ops = execute(gp.gpu_policy, data=POLICY, responses=_host(files=False, enabled=False))
    commands = {op.name.split(" | ", 1)[1].split(" (")[0]: " ".join(op.commands) for op in ops}
    assert (
        "grep -Ev" in commands["GPU policy settings"]
        and "^GPU_CLOCK_MAX_MHZ=[0-9]*$" in commands["GPU policy settings"]
    )
    assert "^ExecStart=(/usr/local/sbin/sparkrig-gpu-policy)$" in commands["GPU policy unit"]
    assert "&& { sh -n" in commands["GPU policy script"]


# Reports ------------------------------------------------------------------------------


def test_report_cells_show_temperature_power_clock_cap_and_reasons():
    from sparkrig.tools import fleet_page, report  # noqa: PLC0415

    state = gpu.parse(fact_output(applied="boot b\nclock_max_mhz 1500 ok"))
    cells = report.gpu_cells(state)
    assert cells == {
        "gpu_temp": "40 °C",
        "gpu_power": "73/700 W",
        "gpu_clock": "345/1980 MHz",
        "gpu_cap": "1500 MHz",
        "gpu_reasons": "gpu_idle",
    }
    assert (
        report.gpu_cells(gpu.parse(fact_output(applied="boot b\nclock_max_mhz 1500 failed 3")))["gpu_cap"]
        == "1500 MHz failed (exit 3)"
    )
    assert set(report.gpu_cells(None).values()) == {"-"}
    page = fleet_page.render({"spark-01": fleet_page.Host(versions=cells)}, columns=report.GPU_COLUMNS)
    assert "GPU temp" in page and "40 °C" in page and "clock event reasons" in page and "gpu_idle" in page
    # A GPU's state differs between hosts and between runs by nature: neither drift nor a change.
    assert report.differing(
        {
            "a": {**dict.fromkeys(report.COLUMNS, "x"), "known_bad": report.NONE, **cells},
            "b": {**dict.fromkeys(report.COLUMNS, "x"), "known_bad": report.NONE, **report.gpu_cells(None)},
        }
    ) == {"a": [], "b": []}
    before = {"started": "t0", "hosts": {"a": {"versions": {**cells, "os": "debian 12"}, "controls": []}}}
    now = {
        "started": "t1",
        "hosts": {"a": {"versions": {**cells, "gpu_temp": "70 °C", "os": "debian 13"}, "controls": []}},
    }
    assert fleet_page.changes(now, [before]).versions == [("a", "os", "debian 12", "debian 13")]


def test_an_nvidia_smi_others_may_change_is_never_run_as_root(tmp_path, monkeypatch):
    """Neither the read nor the unit's script runs an nvidia-smi that another user could have
    replaced (group- or world-writable here; the tests run as root, so the owner is root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the check is on a root-owned file's mode")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    marker = tmp_path / "ran"
    (bindir / "nvidia-smi").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (bindir / "nvidia-smi").chmod(0o777)
    env = {"PATH": f"{bindir}:/usr/bin:/bin"}
    read = subprocess.run(["sh", "-c", gpu.script()], capture_output=True, text=True, timeout=30, env=env)
    state = gpu.parse(read.stdout.splitlines())
    assert state["gpus"] == [] and state["problem"] == (
        f"{bindir}/nvidia-smi is not root's alone (another user owns it or may change it): not run as root"
    )
    unit = subprocess.run(
        ["sh", str(SCRIPT)], capture_output=True, text=True, timeout=30, env={**env, "GPU_CLOCK_MAX_MHZ": "2100"}
    )
    assert unit.returncode == 1 and "no root-owned nvidia-smi that only root may change" in unit.stdout
    assert not marker.exists()
