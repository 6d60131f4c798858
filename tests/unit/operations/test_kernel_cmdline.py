"""Updates: the kernel's command line. The setting's check, the GRUB drop-in (rendered, then
sourced by the real sh as grub-mkconfig sources it, and checked by the real validator script),
the KernelCmdline fact's parser (a recorded /proc/cmdline) and its script, the rollout's
reboot reason, and the deploy's plan."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig import rendering
from sparkrig.operations import updates as up
from sparkrig.operations.updates import cmdline as up_cmdline
from sparkrig.operations.updates import operations as up_operations
from sparkrig.operations.updates import settings as up_settings
from sparkrig.settings import problems
from sparkrig.tools import rollout_reboot
from tests.unit.operations.test_updates import _host
from tests.unit.pyinfra_fake import HOST_STATE, execute, host_state

DATA = Path(__file__).parent / "data" / "cmdline"
PROC = (DATA / "proc-cmdline-dev-machine.txt").read_text().strip()  # recorded
KHO = {"add": ["kho=off"], "remove": []}
DROP_IN = up_settings.GRUB_DROP_IN


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"add": ["kho=off"], "remove": ["splash"]}, None),
        ({"add": ["kho=off; reboot"]}, "bad parameter to add"),
        ({"add": ['kho="off"']}, "bad parameter to add"),
        ({"add": ["kho=$(id)"]}, "bad parameter to add"),
        ({"add": ["kho=off\nGRUB_TIMEOUT=0"]}, "bad parameter to add"),
        ({"remove": ["splash=1"]}, "bad parameter name to remove"),
        ({"remove": ["*"]}, "bad parameter name to remove"),
        ({"add": ["kho=off"], "remove": ["kho"]}, "a name twice"),
        ({"add": ["kho=off", "kho=on"]}, "a name twice"),
        ({"append": ["kho=off"]}, "allowed is a mapping"),
        (["kho=off"], "allowed is a mapping"),
    ],
)
def test_the_setting_is_checked_before_any_host_is_contacted(value, expected):
    found = problems(up.SETTINGS, {"updates_kernel_cmdline": value})
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and "updates_kernel_cmdline" in found[0] and expected in found[0], found


def _sourced(text: str, tmp_path, linux: str, default: str) -> tuple[str, str]:
    """GRUB_CMDLINE_LINUX and _DEFAULT after the real sh sources /etc/default/grub's values, then the drop-in."""
    path = tmp_path / "90-sparkrig-cmdline.cfg"
    path.write_text(text)
    result = subprocess.run(
        [
            "sh",
            "-c",
            '. "$1" && printf "%s\\n%s\\n" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"',
            "sh",
            str(path),
        ],
        env={"PATH": "/usr/bin:/bin", "GRUB_CMDLINE_LINUX": linux, "GRUB_CMDLINE_LINUX_DEFAULT": default},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    out = result.stdout.split("\n")
    return out[0], out[1]


def test_the_drop_in_adds_once_replaces_other_values_and_removes_as_sourced_by_sh(tmp_path):
    text = up_operations.render_cmdline({"add": ["kho=off"], "remove": ["splash"]})
    assert "# sparkrig-cmdline add kho=off\n# sparkrig-cmdline remove splash\n" in text
    linux, default = _sourced(text, tmp_path, "ro kho=on", "quiet splash splash=verbose")
    assert (linux, default) == ("ro kho=off", "quiet")
    assert _sourced(text, tmp_path, "", "") == ("kho=off", "")
    assert up_operations.render_cmdline({"add": [], "remove": []}) is None


def _validate(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "candidate.cfg"
    path.write_text(text)
    script = rendering.script("updates/grub-cmdline-check.sh")
    return subprocess.run(["sh", "-c", script, "sh", str(path)], capture_output=True, text=True, timeout=30)


def test_the_validator_accepts_the_drop_in_and_refuses_one_that_breaks_the_line(tmp_path):
    good = up_operations.render_cmdline({"add": ["kho=off"], "remove": ["splash"]})
    assert _validate(tmp_path, good).returncode == 0, _validate(tmp_path, good).stderr
    doubled = good.replace(' kho=off"', ' kho=off kho=off"')
    assert "kho=off 2 times" in _validate(tmp_path, doubled).stderr
    kept = good.replace("      kho | kho=* | splash | splash=*) ;;", "      kho | kho=*) ;;")
    assert kept != good and "leaves" in _validate(tmp_path, kept).stderr
    assert _validate(tmp_path, good + "if then\n").returncode != 0  # sh -n


def _run_script(tmp_path, drop_in: str | None, grub_cfg: str | None, loader: bool) -> list[str]:
    """The fact's real script, with /proc/cmdline, /boot/grub/grub.cfg and update-grub as STAND-INs
    (a copy of the script pointed at files under tmp_path)."""
    (tmp_path / "cmdline").write_text(PROC + "\n")
    script = rendering.script("updates/cmdline.sh").replace("/proc/cmdline", str(tmp_path / "cmdline"))
    script = script.replace("/boot/grub/grub.cfg", str(tmp_path / "grub.cfg"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("cat", "sed", "head"):
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    if loader:
        (bin_dir / "update-grub").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "update-grub").chmod(0o755)
    if grub_cfg is not None:
        (tmp_path / "grub.cfg").write_text(grub_cfg)
    path = tmp_path / "drop-in.cfg"
    if drop_in is not None:
        path.write_text(drop_in)
    result = subprocess.run(
        ["/bin/sh", "-c", script, "sparkrig-cmdline", str(path)],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.splitlines()


GRUB_CFG = """menuentry 'DGX OS' {
\tlinux\t/boot/vmlinuz-6.17.0-1032-nvidia root=UUID=1234 ro quiet splash kho=off
\tinitrd\t/boot/initrd.img-6.17.0-1032-nvidia
}
"""


def test_the_fact_reads_what_booted_what_the_drop_in_asks_and_the_generated_line(tmp_path):
    drop_in = up_operations.render_cmdline(KHO)
    found = up_cmdline.KernelCmdline().process(_run_script(tmp_path, drop_in, GRUB_CFG, loader=True))
    assert found["running"] == PROC.split() and "kho=off" not in found["running"]
    assert (found["add"], found["remove"], found["loader"]) == (["kho=off"], [], True)
    assert found["generated"] == ["root=UUID=1234", "ro", "quiet", "splash", "kho=off"]
    # Booted without it: the rollout's reboot reason.
    assert up_cmdline.cmdline_reasons(found) == ["kernel command line: kho=off is not on it (/proc/cmdline)"]
    assert ("sparkrig.operations.updates.cmdline.KernelCmdline", up_cmdline.cmdline_reasons) in (
        rollout_reboot.REBOOT_READINGS
    )
    bare = up_cmdline.KernelCmdline().process(_run_script(tmp_path / "..", None, None, loader=False))
    assert (bare["add"], bare["loader"], bare["generated"]) == ([], False, None)
    assert up_cmdline.cmdline_reasons({**found, "loader": False}) == []  # nothing applies it: no reboot helps


@pytest.mark.parametrize("bad", ["running ro\x1b[2J", "add kho=off\rremove x", "loader maybe", "other line"])
def test_bytes_the_parser_cannot_read_fail_that_host(bad):
    with pytest.raises(FactProcessError):
        up_cmdline.KernelCmdline().process(["running ro", bad])


# The plan ---------------------------------------------------------------------------------

CMDLINE = "sparkrig-cmdline"


def _plan(setting, drop_in, running="ro quiet", loader=True, generated="ro quiet") -> list[str]:
    responses = _host()
    responses[HOST_STATE] = [line for line in responses[HOST_STATE] if not line.endswith(DROP_IN)] + host_state(
        files={DROP_IN: drop_in}
    )
    content = up_operations.render_cmdline(setting) or ""
    responses[CMDLINE] = [
        f"running {running}",
        *[line.removeprefix("# sparkrig-cmdline ") for line in content.splitlines() if "# sparkrig-cmdline " in line],
        f"loader {'update-grub' if loader else 'none'}",
        *([f"generated {generated}"] if generated is not None else []),
    ]
    planned = execute(up.updates, data={"updates_kernel_cmdline": setting}, responses=responses)
    return [op.name.removeprefix("Updates | ") for op in planned]


WRITE = f"The kernel's command line as updates_kernel_cmdline says ({DROP_IN})"
GRUB = "GRUB's configuration regenerated for the kernel's command line (update-grub)"


def test_the_drop_in_is_written_validated_then_update_grub_runs():
    assert _plan(KHO, None) == [WRITE, GRUB]
    drop_in = up_operations.render_cmdline(KHO)
    # Converged and booted with it: nothing. Generated without it (a failed update-grub): again.
    assert _plan(KHO, drop_in, running="ro quiet kho=off", generated="ro quiet kho=off") == []
    assert _plan(KHO, drop_in, running="ro quiet kho=off", generated="ro quiet") == [GRUB]
    # No boot loader (a container): the drop-in only.
    assert _plan(KHO, None, loader=False, generated=None) == [WRITE]
    # The setting emptied: the drop-in goes, and GRUB is regenerated.
    assert _plan({"add": [], "remove": []}, drop_in) == [f"No kernel command line drop-in ({DROP_IN})", GRUB]
    assert _plan({"add": [], "remove": []}, None) == []


def test_the_write_is_atomic_and_validated():
    responses = _host()
    responses[CMDLINE] = ["running ro", "loader update-grub"]
    planned = execute(up.updates, data={"updates_kernel_cmdline": KHO}, responses=responses)
    (write,) = [op for op in planned if op.name.endswith(f"({DROP_IN})")]
    text = "\n".join(write.commands)
    assert "grub-cmdline-check" in text or "sparkrig-cmdline add" in text
    assert "sh -n" in text and "mv" in text
