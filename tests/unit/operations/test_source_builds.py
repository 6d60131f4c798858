"""Source builds: the shipped catalogue and the settings checks, stamp keys, the build script,
the fact, the requirement lines handed to python_stack, and the plan for hosts with nothing
enabled, a converged build, a fresh build, one running, one failed, and a wheel in the cache."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig import host_output, python_wheels, reading, user_files, wheelhouse
from sparkrig import stack_locks as ps_locks
from sparkrig.operations.python_stack import deploy as ps_deploy  # noqa: F401 (registers the venv sync)
from sparkrig.operations.python_stack import operations as ps_ops
from sparkrig.operations.source_builds import cache as sb_cache
from sparkrig.operations.source_builds import catalogue as sb_catalogue
from sparkrig.operations.source_builds import deploy as sb_deploy
from sparkrig.operations.source_builds import facts as sb_facts
from sparkrig.operations.source_builds import operations as sb_ops
from sparkrig.operations.source_builds import settings as sb_settings
from sparkrig.packages import install_command
from sparkrig.settings import SettingsError, all_settings, problems, resolve, validate_hosts
from tests.unit import pyinfra_fake
from tests.unit.operations.test_python_stack import records
from tests.unit.pyinfra_fake import execute, plan

SETTINGS = all_settings()
# As deploy.py calls it: python_stack's operation installs the built wheels.
DEPLOY = sb_deploy.source_builds  # python_stack's deploy, imported, syncs the venv (sparkrig/wheelhouse.py)
CATALOGUE = sb_settings.load_catalogue()
FACT = 'echo "unit $n'  # SourceBuilds' command holds this
STACK = "sparkrig-dists"  # PythonStack's
LAB = {
    "kind": "wheel",
    "url": "http://10.0.0.1:8765/sources/lab.git",
    "ref": "a" * 40,
    "package": "lab-ext",
    "env": {"MAX_JOBS": "2"},
    "steps": ["python -c 'print(1)'"],
    "build_requirements": ["setuptools>=61"],
    "build_packages": ["gcc", "python3-dev"],
    "submodules": False,
    "subdirectory": ".",
    "uses_torch": False,
    "abi3": True,
    "memory_max": "2G",
}


def _catalogue(**changes) -> dict:
    catalogue = copy.deepcopy(CATALOGUE)
    catalogue["lab"] = {**LAB, **changes}
    return catalogue


def _data(**data) -> dict:
    return resolve(SETTINGS, {"source_builds": _catalogue(), "source_builds_enabled": ["lab"], **data})


def _problems(**data) -> list[str]:
    return problems(SETTINGS, data)


# The catalogue and the settings ----------------------------------------------------------


def test_defaults_and_the_shipped_catalogue_are_valid_and_off():
    assert _problems() == []
    assert resolve(SETTINGS, {})["source_builds_enabled"] == []
    for name in CATALOGUE:
        assert _problems(source_builds_enabled=[*CATALOGUE[name].get("needs", []), name]) == [], name


def test_the_shipped_builds_are_the_checked_recipes():
    triton, xformers, vllm = CATALOGUE["triton"], CATALOGUE["xformers"], CATALOGUE["vllm"]
    assert triton["ref"] == "c5d671f91d90f40900027382f98b17a3e04045f6"
    assert triton["url"] == "https://github.com/triton-lang/triton.git"
    assert xformers["ref"] == "v0.0.33" and xformers["torch_cuda_arch_list"] == {"gb10": "12.1"}
    assert xformers["submodules"] and xformers["uses_torch"]
    assert vllm["steps"][0] == "python use_existing_torch.py" and vllm["uses_torch"]
    assert vllm["env"] == {"MAX_JOBS": "4"} and "torch_cuda_arch_list" not in vllm  # gb10's own 12.1a


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"source_builds": _catalogue(ref="main")}, "lab.ref must be a commit id"),
        ({"source_builds": _catalogue(ref="v1.0 && rm")}, "lab.ref must be a commit id"),
        ({"source_builds": _catalogue(url="https://x/'$(id)'")}, "lab.url must be"),
        ({"source_builds": _catalogue(url="git@github.com:x/y")}, "lab.url must be"),
        ({"source_builds": _catalogue(env={"A B": "1"})}, "lab.env must map"),
        ({"source_builds": _catalogue(steps=["make\nrm -rf /"])}, "lab.steps must be"),
        ({"source_builds": _catalogue(build_requirements=["ninja; rm"])}, "lab.build_requirements"),
        ({"source_builds": _catalogue(build_packages=["Gcc"])}, "lab.build_packages"),
        ({"source_builds": _catalogue(subdirectory="../up")}, "lab.subdirectory"),
        ({"source_builds": _catalogue(memory_max="lots")}, "lab.memory_max must be null or"),
        ({"source_builds": _catalogue(abi3="yes")}, "lab.abi3 must be true or false"),
        (
            {"source_builds": _catalogue(env={"TORCH_CUDA_ARCH_LIST": "12.1"})},
            "lab.env must not set TORCH_CUDA_ARCH_LIST",
        ),
        ({"source_builds": _catalogue(torch_cuda_arch_list={"gb10": "sm_121"})}, "lab.torch_cuda_arch_list must map"),
        ({"source_builds": {"Bad_Name": LAB}}, "'Bad_Name' is not a build name"),
        ({"source_builds": {"lab": {**LAB, "colour": "red"}}}, "lab (kind wheel) must hold exactly"),
        ({"source_builds_enabled": ["tritonn"]}, "a list of builds of source_builds: triton, vllm, xformers"),
        ({"source_builds_enabled": ["triton", "triton"]}, "a list of builds of source_builds"),
        (
            {"source_builds_enabled": ["vllm"], "python_stack": {**ps_locks.load_manifest(), "torch": None}},
            "vllm compiles against torch, but python_stack installs no torch",
        ),
        ({"source_builds_wait": "yes"}, "True (wait for builds) or False"),
        ({"source_builds_controller_cache": "cache/wheels"}, "a normalised absolute path on the controller"),
    ],
)
def test_bad_values_are_refused_with_what_is_allowed(data, expected):
    # A changed manifest also has no fresh lock: that is python_stack_locks' own error.
    found = [p for p in _problems(**data) if not p.startswith("python_stack_locks")]
    assert len(found) == 1 and expected in found[0], found


def test_one_error_names_the_host_the_key_and_what_is_allowed():
    with pytest.raises(SettingsError) as error:
        validate_hosts([("spark-02", {"source_builds_enabled": ["flash-attn"]})])
    assert "host 'spark-02': source_builds_enabled = ['flash-attn']: allowed is a list of builds" in str(error.value)


# Stamps ------------------------------------------------------------------------------------


def _key(**changes) -> str:
    data = _data(
        source_builds=_catalogue(**{k: v for k, v in changes.items() if k in LAB}),
        **{k: v for k, v in changes.items() if k not in LAB},
    )
    return sb_catalogue.wanted(data)["lab"]


def test_the_stamp_key_follows_what_makes_the_wheel():
    base = _key()
    assert len(base) == sb_catalogue.KEY_LENGTH
    for change in (
        {"ref": "b" * 40},
        {"env": {"MAX_JOBS": "4"}},
        {"steps": []},
        {"build_requirements": []},
        {"submodules": True},
        {"subdirectory": "python"},
        {"package": "other"},
        {"hardware_profile": "hopper"},
        {"abi3": False},
    ):
        assert _key(**change) != base, change
    assert sb_catalogue.wanted(_data(source_builds=_catalogue(torch_cuda_arch_list={"gb10": "12.1"})))["lab"] != base
    # Not what leaves the wheel alone: where a commit is fetched from, memory, apt packages.
    for change in ({"url": "/srv/mirror/lab.git"}, {"memory_max": None}, {"build_packages": []}):
        assert _key(**change) == base, change


def test_a_tag_is_keyed_with_its_url_a_commit_is_not():
    assert _key(ref="v1.0") != _key(ref="v1.0", url="/srv/mirror/lab.git")


def test_python_and_torch_count_only_where_the_wheel_depends_on_them():
    manifest = ps_locks.load_manifest()
    other_python = {**manifest, "python": "3.13"}
    other_torch = {**manifest, "torch": {**manifest["torch"], "packages": {"torch": "2.12.0"}}}
    assert _key(python_stack=other_python) == _key()  # abi3
    assert _key(abi3=False, python_stack=other_python) != _key(abi3=False)
    assert _key(python_stack=other_torch) == _key()
    assert _key(uses_torch=True, python_stack=other_torch) != _key(uses_torch=True)


# The build script --------------------------------------------------------------------------


def _script(**changes) -> str:
    data = _data(source_builds=_catalogue(**changes))
    return sb_ops.render_build_script("lab", sb_catalogue.wanted(data)["lab"], data)


def test_the_build_script_is_valid_sh_and_checks_out_the_pinned_commit(tmp_path):
    script = _script()
    (tmp_path / "build.sh").write_text(script)
    subprocess.run(["sh", "-n", str(tmp_path / "build.sh")], check=True)
    assert "git clone --quiet --no-checkout -- http://10.0.0.1:8765/sources/lab.git src" in script
    assert f"commit={'a' * 40}\n" in script
    assert "python -m pip wheel --no-deps --no-build-isolation" in script
    assert script.index("python -c 'print(1)'") < script.index("pip wheel")
    assert "pip setuptools wheel 'setuptools>=61'" in script
    assert "submodule update" not in script


def test_a_tag_is_resolved_as_a_tag_never_a_branch():
    script = _script(ref="v2.0", submodules=True, url="/srv/my mirror/lab.git")
    assert "rev-parse --verify --quiet 'refs/tags/v2.0^{commit}'" in script
    assert "git -C src submodule update --init --recursive" in script
    assert "-- '/srv/my mirror/lab.git' src" in script


def test_the_stamp_records_the_inputs_and_the_url():
    script = _script()
    (line,) = [line for line in script.splitlines() if line.startswith("SPARKRIG_STAMP=")]
    stamp = json.loads(shlex.split(line)[0].split("=", 1)[1])
    assert stamp["url"] == LAB["url"] and stamp["ref"] == LAB["ref"]
    # Values only as their sha256: build.sh and the stamp are 0644, and the stamp travels.
    assert stamp["env"] == {k: hashlib.sha256(v.encode()).hexdigest() for k, v in LAB["env"].items()}
    assert stamp["key"] == sb_catalogue.wanted(_data())["lab"]


def _record(name: str = "lab", **data) -> dict:
    """The stamp.json a build writes (its inputs, as build.sh carries them)."""
    data = _data(**data)
    script = sb_ops.render_build_script(name, sb_catalogue.wanted(data)[name], data)
    (line,) = [line for line in script.splitlines() if line.startswith("SPARKRIG_STAMP=")]
    return json.loads(shlex.split(line)[0].split("=", 1)[1])


def test_a_build_targets_the_hosts_gpu_and_its_record_says_so():
    hopper, gb10 = _record(hardware_profile="hopper"), _record(hardware_profile="gb10")
    assert (hopper["profile"], hopper["target"]) == ("hopper", "9.0")
    assert (gb10["profile"], gb10["target"]) == ("gb10", "12.1a")
    assert _record(hardware_profile="rtx50")["target"] == "12.0"
    # The catalogue's xformers keeps Unsloth's 12.1 on a Spark, and follows any other profile.
    xformers = {"source_builds_enabled": ["xformers"]}
    assert _record("xformers", hardware_profile="gb10", **xformers)["target"] == "12.1"
    assert _record("xformers", hardware_profile="hopper", **xformers)["target"] == "9.0"
    # A hopper host never shares a gb10 build: another target is another key.
    assert hopper["key"] != gb10["key"]


def test_the_build_unit_gets_the_target_after_the_cuda_env_file():
    for profile, target in (("hopper", "9.0"), ("gb10", "12.1a")):
        ops = _ops("absent", hardware_profile=profile)
        d = sb_catalogue.build_dir("lab", sb_catalogue.wanted(_data(hardware_profile=profile))["lab"])
        assert ops[0].uploads[f"{d}/env.new"] == f"MAX_JOBS='2'\nTORCH_CUDA_ARCH_LIST='{target}'\n".encode()
        build = "\n".join(ops[0].commands)
        # systemd reads the EnvironmentFiles in order: the build's own wins over cuda.env's.
        assert build.index("EnvironmentFile=-/etc/sparkrig/cuda.env") < build.index(f"EnvironmentFile={d}/env")


def test_the_compliance_control_fails_on_a_build_for_another_gpu():
    from tests.compliance.test_source_builds import target_problem  # noqa: PLC0415 (the compliance suite, only here)

    settings = _data(hardware_profile="hopper")
    spec = settings["source_builds"]["lab"]
    assert target_problem(_record(hardware_profile="hopper"), spec, settings, "hopper") is None
    problem = target_problem(_record(hardware_profile="gb10"), spec, settings, "hopper")
    assert problem and "'12.1a'" in problem and "wants '9.0'" in problem
    # A record of the same profile but another target (an override changed since) fails too.
    stale = {**_record(hardware_profile="hopper"), "target": "12.1"}
    assert target_problem(stale, spec, settings, "hopper")


# The fact ----------------------------------------------------------------------------------

WHEEL = "lab_ext-1.0.0-cp38-abi3-linux_x86_64.whl"
CURRENT = f"lab-ext @ file:///var/lib/sparkrig/wheelhouse/lab/0123/{WHEEL} --hash=sha256:{'c' * 64}"


def _fact_output(state: str = "built", current: str | None = None) -> list[str]:
    stamp = {"ref": LAB["ref"], "wheel": WHEEL, "sha256": "d" * 64, "version": "1.0.0"}
    lines = [f"unit lab {'active' if state == 'running' else 'inactive'}"]
    if state == "built":
        lines += [f"stamp lab {json.dumps(stamp)}", f"wheel lab {pyinfra_fake.user_field(WHEEL)}"]
    if state == "failed":
        lines += ["attempt lab yes", f"result lab {pyinfra_fake.user_field('1')}"]
    if current:
        lines.append(f"current lab {current}")
    return lines


@pytest.mark.parametrize("state", ["built", "running", "failed", "absent"])
def test_fact_reads_each_state(state):
    found = sb_facts.SourceBuilds().parse(_fact_output(state))["lab"]
    assert found["state"] == state
    assert (found["stamp"] is not None) == (state == "built")


def test_fact_a_killed_build_is_failed_and_a_stamp_without_its_wheel_is_not_built():
    assert sb_facts.SourceBuilds().parse(["unit lab inactive", "attempt lab yes"])["lab"]["state"] == "failed"
    stamp = json.dumps({"wheel": WHEEL, "sha256": "d" * 64})
    assert sb_facts.SourceBuilds().parse([f"stamp lab {stamp}"])["lab"]["state"] == "absent"


def test_fact_command_quotes_its_paths_and_reads_the_venvs_line():
    command = (
        sb_facts.SourceBuilds().command((("lab", "0123", "lab-ext @ file:///w/lab/"),), "/opt/my venv").get_raw_value()
    )
    assert command.startswith(
        "{ r='/opt/my venv/sparkrig/requirements.lock';n=lab; d=/var/lib/sparkrig/source-builds/lab/0123"
    )
    assert "| grep -F -- 'lab-ext @ file:///w/lab/'" in command
    assert "systemctl is-active" in command and command.endswith("true \n} | base64 -w0; echo; echo sparkrig-end")


# Requirement lines -------------------------------------------------------------------------


def test_requirements_take_the_built_wheel_else_keep_the_venvs_earlier_one():
    data = _data()
    key = sb_catalogue.wanted(data)["lab"]
    built = sb_facts.requirement_lines(data, sb_facts.SourceBuilds().parse(_fact_output("built", CURRENT)))
    assert built == {
        "lab-ext": f"lab-ext @ file:///var/lib/sparkrig/wheelhouse/lab/{key}/{WHEEL} --hash=sha256:{'d' * 64}"
    }
    pending = sb_facts.requirement_lines(data, sb_facts.SourceBuilds().parse(_fact_output("running", CURRENT)))
    assert pending == {"lab-ext": CURRENT}
    assert sb_facts.requirement_lines(data, sb_facts.SourceBuilds().parse(_fact_output("failed"))) == {}


def test_a_built_package_replaces_the_locked_entry_of_the_same_name():
    lock = (ps_locks.locks_dir(ps_locks.LOCKS) / "aarch64-py3.12.txt").read_text()
    line = (
        "vllm @ file:///var/lib/sparkrig/wheelhouse/vllm/0123/vllm-0.20.2-cp38-abi3-linux_aarch64.whl "
        f"--hash=sha256:{'e' * 64}"
    )
    text = ps_locks.host_lock(lock, {"vllm": line})
    assert line in text.splitlines()
    assert "files.pythonhosted.org" not in text
    assert [pin for pin in text.splitlines() if pin.startswith("vllm")] == [line]
    assert ps_locks.lock_stamp(text) == ps_locks.lock_stamp(lock)
    others = [e for e in python_wheels.lock_entries(lock) if e[0] != "vllm"]
    assert [e for e in python_wheels.lock_entries(text) if e[0] != "vllm"] == others


# The plan ----------------------------------------------------------------------------------


def _stack_output(lock: str) -> list[str]:
    wanted = hashlib.sha256(lock.encode()).hexdigest()
    return [
        "uv 0.13.9",
        "link_exists yes",
        "venv_module yes",
        "cache_owner root",
        "owner_exists yes",
        "occupied yes",
        "python 3.12.3",
        "owner root",
        "usable yes",
        f"lock {wanted}",
        *records(lock),
    ]


def _ops(state: str, current: str | None = None, **data):
    data = {"source_builds": _catalogue(), "source_builds_enabled": ["lab"], **data}
    resolved = resolve(SETTINGS, data)
    fact = sb_facts.SourceBuilds().parse(_fact_output(state, current))
    lock = ps_ops.virtualenv_arguments(resolved, sb_facts.requirement_lines(resolved, fact))["lock"]
    responses = {FACT: _fact_output(state, current), STACK: _stack_output(lock)}
    return execute(DEPLOY, data=data, responses=responses)


def test_nothing_enabled_costs_nothing():
    assert execute(DEPLOY, data={}, responses={}) == []
    assert sb_deploy.host_requirement_lines(resolve(SETTINGS, {})) == {}


def test_a_converged_host_gets_no_operation():
    assert _ops("built") == []
    assert (
        plan(
            DEPLOY,
            data={"source_builds": _catalogue(), "source_builds_enabled": ["lab"]},
            responses={FACT: _fact_output("built")},
        )
        == []
    )


def test_without_the_venv_owners_operation_nothing_is_written_into_the_venv(monkeypatch):
    """source_builds never writes into the venv itself: python_stack owns it, and syncs it
    through the shared contract (sparkrig/wheelhouse.py) only where its deploy is imported."""
    monkeypatch.setattr(wheelhouse, "_SYNC", [])
    ops = execute(sb_deploy.source_builds, data=_data(), responses={FACT: _fact_output("absent")})
    assert ops and not any("venv" in op.name for op in ops)


def test_a_fresh_host_builds_detached_in_training_slice_waits_and_installs():
    ops = _ops("absent", python_venv_owner="spark", jobs_oom_score_adj=600)
    names = [op.name for op in ops]
    assert names[0] == "Source builds | Source build lab, on its builder"
    assert "controller's cache" in names[1] and "controller's cache" in names[2]
    assert names[3] == "Source builds | Built wheels into the venv (python_venv_path)"
    build = "\n".join(ops[0].commands)
    # The build's packages, installed as every concern installs them (a bounded wait for dpkg's lock).
    assert ops[0].commands[0] == install_command(["gcc", "python3-dev"], 300).get_raw_value()
    unit = sb_catalogue.unit_name("lab", sb_catalogue.wanted(_data())["lab"])
    assert f"if systemctl is-active --quiet {unit} ; then" in build
    assert f"systemd-run --quiet --collect --unit {unit}" in build
    assert "--slice training.slice --uid spark" in build
    for prop in (
        "Nice=10",
        "OOMScoreAdjust=600",
        "MemorySwapMax=0",
        "MemoryMax=2G",
        "EnvironmentFile=-/etc/sparkrig/cuda.env",
        "RuntimeMaxSec=6h",
    ):
        assert f"--property {prop}" in build, prop
    # The build's own environment from a root-owned 0600 file, never on the command line.
    assert "MAX_JOBS" not in build and "--setenv UV_SYSTEM_CERTS=1" in build
    d = sb_catalogue.build_dir("lab", sb_catalogue.wanted(_data())["lab"])
    assert f"--property EnvironmentFile={d}/env" in build and f"--property WorkingDirectory={d}/work" in build
    assert 'while case "$(systemctl is-active "$u"' in build and "journalctl -u" in build
    assert ops[0].uploads[f"{d}/.build.sh.sparkrig-new"].decode() == _script()
    assert ops[0].uploads[f"{d}/env.new"] == b"MAX_JOBS='2'\nTORCH_CUDA_ARCH_LIST='12.1a'\n"
    assert f"install -m 600 -o root -g root /dev/null {d}/env.new" in build
    # One host in the run: nothing to fetch for others, nothing to receive.
    assert ops[1].commands == [] and ops[2].commands == []


def test_detached_a_fresh_build_starts_and_the_deploy_returns():
    ops = _ops("absent", source_builds_wait=False)
    build = "\n".join(ops[0].commands)
    assert "systemd-run" in build and "while case" not in build


def test_a_running_build_is_waited_for_never_started_again():
    ops = _ops("running", CURRENT)
    build = "\n".join(ops[0].commands)
    assert "systemd-run" not in build and "while case" in build
    assert _ops("running", CURRENT, source_builds_wait=False)[0].commands == []


def test_a_failed_build_fails_the_host_with_the_journal_tail_and_changes_nothing_else():
    (op,) = _ops("failed", CURRENT)
    assert op.name == "Source builds | Source build lab failed"
    (command,) = op.commands
    assert 'journalctl -u "$u" -n 30' in command and 'rm -f "$d/attempt" "$d/work/result"; exit 1' in command


def test_a_wheel_in_the_controllers_cache_is_uploaded_not_built(tmp_path):
    data = _data()
    key = sb_catalogue.wanted(data)["lab"]
    entry = tmp_path / "lab" / key
    entry.mkdir(parents=True)
    (entry / sb_catalogue.CACHED_WHEEL).write_bytes(b"wheel")
    stamp = {"wheel": WHEEL, "sha256": hashlib.sha256(b"wheel").hexdigest()}
    (entry / "stamp.json").write_text(json.dumps(stamp))
    ops = _ops("absent", source_builds_controller_cache=str(tmp_path))
    assert ops[0].commands == [] and ops[1].commands == []
    receive = ops[2]
    assert receive.uploads[f"/var/lib/sparkrig/incoming/lab-{key}/stamp.json"].startswith(b'{"sha256"')
    assert receive.uploads[f"/var/lib/sparkrig/incoming/lab-{key}/{WHEEL}"] == b"wheel"
    assert "runuser -u root -- sh -c" in "\n".join(receive.commands)


def test_the_cache_keeps_a_fetched_wheel_only_when_its_sha256_matches(tmp_path):
    staging = tmp_path / ".new"
    staging.mkdir()
    (staging / sb_catalogue.CACHED_WHEEL).write_bytes(b"wheel")
    with pytest.raises(ValueError, match="has sha256"):
        sb_cache._keep_in_cache(str(staging), str(tmp_path / "k"), {"wheel": WHEEL, "sha256": "0" * 64})
    assert not staging.exists() and not (tmp_path / "k").exists()
    staging.mkdir()
    (staging / sb_catalogue.CACHED_WHEEL).write_bytes(b"wheel")
    stamp = {"wheel": WHEEL, "sha256": hashlib.sha256(b"wheel").hexdigest()}
    sb_cache._keep_in_cache(str(staging), str(tmp_path / "k"), stamp)
    assert sb_cache.cached(tmp_path.parent, tmp_path.name, "k") == stamp


def test_a_peer_whose_profile_is_still_auto_has_no_known_key():
    """Another host of the run whose box hardware() has not read yet must not break the
    current host's plan (its key is unknown, so it is not counted as a peer)."""
    data = _data()
    assert sb_catalogue.known_keys(data) == sb_catalogue.wanted(data)
    assert sb_catalogue.known_keys({**data, "hardware_profile": "auto"}) is None


# A hostile builder: the venv's owner writes the stamp and the wheelhouse ----------------------

HOSTILE_WHEELS = [
    "../../../../../.bashrc",
    "x.whl; touch /tmp/pwned",
    "a/b-1.0-py3-none-any.whl",
    "lab_ext-1.0.0-cp38-abi3-linux_x86_64.whl\n",
    "-rf-1-py3-none-any.whl",
    "..",
]


@pytest.mark.parametrize("wheel", HOSTILE_WHEELS)
def test_a_stamp_naming_a_path_fails_that_host(wheel):
    """A wheel name from the host never becomes a path on the controller nor a word of a
    root command: the fact refuses it (that host fails, with the reason)."""
    stamp = json.dumps({"wheel": wheel, "sha256": "d" * 64})
    output = pyinfra_fake.encode(
        ["unit lab inactive", f"stamp lab {stamp}", f"wheel lab {pyinfra_fake.user_field(wheel)}"]
    )
    with pytest.raises(FactProcessError, match="is not a wheel file name"):
        sb_facts.SourceBuilds().process(output)


@pytest.mark.parametrize("wheel", HOSTILE_WHEELS)
def test_the_controller_never_keeps_or_hands_on_a_hostile_name(tmp_path, wheel):
    staging = tmp_path / ".new"
    staging.mkdir()
    (staging / sb_catalogue.CACHED_WHEEL).write_bytes(b"wheel")
    with pytest.raises(ValueError, match="not a wheel file name"):
        sb_cache._keep_in_cache(
            str(staging), str(tmp_path / "k"), {"wheel": wheel, "sha256": hashlib.sha256(b"wheel").hexdigest()}
        )
    assert not (tmp_path / "k").exists()
    # A cache entry planted by hand with such a name is not used either.
    entry = tmp_path / "lab" / "k"
    entry.mkdir(parents=True)
    (entry / sb_catalogue.CACHED_WHEEL).write_bytes(b"wheel")
    (entry / "stamp.json").write_text(json.dumps({"wheel": wheel, "sha256": "d" * 64}))
    assert sb_cache.cached(tmp_path, "lab", "k") is None


def test_fetch_names_every_local_and_remote_path_itself(tmp_path):
    """The builder's wheel is read by its owner into a root-owned file the controller named,
    downloaded without sudo (pyinfra's sudo get_file puts the path unquoted in a root
    command line) and kept as wheel.whl."""
    data = _data(python_venv_owner="spark", source_builds_controller_cache=str(tmp_path))
    key = sb_catalogue.wanted(data)["lab"]
    responses = {"n=lab": _fact_output("built")}
    ops = pyinfra_fake.plan(
        lambda: sb_cache.fetch(name="fetch", build_name="lab", key=key, cache=str(tmp_path), owner="spark"),
        data,
        responses,
    )
    (op,) = ops
    outgoing = f"/var/lib/sparkrig/outgoing/lab-{key}.whl"
    assert op.commands[0] == (
        f"install -d -m 755 -o root -g root /var/lib/sparkrig/outgoing && rm -f {outgoing} && "
        + user_files.copy_out(
            f"/var/lib/sparkrig/wheelhouse/lab/{key}/{WHEEL}", outgoing, 32 << 30, "spark", 1800, "source build lab"
        )
        + f" && chmod 644 {outgoing}"
    )
    assert op.commands[2] == f"download: {outgoing} -> {tmp_path}/lab/.{key}.@fake/spark.new/wheel.whl"


def test_receive_as_the_owner_in_a_scratch_tree(tmp_path):
    """The real receive script, run by sh: a planted link where the new entry goes is
    replaced, not followed, and a wheel whose sha256 differs is refused."""
    incoming, wheelhouse, elsewhere = tmp_path / "incoming", tmp_path / "wheelhouse", tmp_path / "etc"
    for d in (incoming, wheelhouse, elsewhere):
        d.mkdir()
    (incoming / WHEEL).write_bytes(b"wheel")
    (incoming / "stamp.json").write_text("{}")
    entry = wheelhouse / "key"
    (wheelhouse / "key.new").symlink_to(elsewhere)  # planted by the owner
    sha = hashlib.sha256(b"wheel").hexdigest()
    run = subprocess.run(["sh", "-c", sb_cache.RECEIVE_SCRIPT, "receive", str(incoming), str(entry), WHEEL, sha])
    assert run.returncode == 0
    assert (entry / WHEEL).read_bytes() == b"wheel" and list(elsewhere.iterdir()) == []
    bad = subprocess.run(
        ["sh", "-c", sb_cache.RECEIVE_SCRIPT, "receive", str(incoming), str(entry), WHEEL, "0" * 64],
        capture_output=True,
    )
    assert bad.returncode != 0 and (entry / WHEEL).read_bytes() == b"wheel"


@pytest.mark.parametrize("result, stamp, ends", [("0", True, 0), ("1", True, 1), ("0", False, 1), (None, False, 1)])
def test_the_end_of_an_attempt_in_a_scratch_tree(tmp_path, result, stamp, ends):
    """The real wait and result scripts, run by dash on a unit that is not running: a build
    that wrote exit status 0 and its stamp succeeds; anything else fails and clears the attempt."""
    d, w = tmp_path / "build", tmp_path / "wheelhouse"
    (d / "work").mkdir(parents=True)
    w.mkdir()
    (d / "attempt").touch()
    if result is not None:
        (d / "work" / "result").write_text(result + "\n")
    if stamp:
        (w / "stamp.json").write_text("{}")
    for script in (sb_ops.RESULT_SCRIPT, sb_ops.WAIT_SCRIPT):
        (d / "attempt").touch()
        run = subprocess.run(
            ["dash", "-c", script, "build", "sparkrig-build-lab-0123.service", str(d), str(w), "lab"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == ends, run.stderr
        assert not (d / "attempt").exists()
        if ends:
            assert "sparkrig: source build lab failed (exit status " + (result or "none") in run.stderr
            assert not (d / "work" / "result").exists()
            if result is not None:
                (d / "work" / "result").write_text(result + "\n")
        else:
            assert run.stdout == "sparkrig: source build lab finished\n"


@pytest.mark.parametrize("url", ["https://user:ghp_secret@github.com/x/y.git", "https://token@example.com/r.git"])
def test_credentials_in_a_url_are_refused(url):
    found = problems(sb_settings.SETTINGS, {"source_builds": {**CATALOGUE, "lab": {**LAB, "url": url}}})
    assert found and "credentials" in found[0] and "ghp_secret" not in found[0] and "token@example" not in found[0]


def test_a_secret_env_value_reaches_no_world_readable_file_nor_command_line():
    data = _data(source_builds={**CATALOGUE, "lab": {**LAB, "env": {"HF_TOKEN": "hf_secret123"}}})
    script = sb_ops.render_build_script("lab", sb_catalogue.wanted(data)["lab"], data)
    assert "hf_secret123" not in script
    ops = _ops("absent", source_builds={**CATALOGUE, "lab": {**LAB, "env": {"HF_TOKEN": "hf_secret123"}}})
    assert not any("hf_secret123" in c for op in ops for c in op.commands)
    (env,) = [v for k, v in ops[0].uploads.items() if k.endswith("/env.new")]
    assert env == b"HF_TOKEN='hf_secret123'\nTORCH_CUDA_ARCH_LIST='12.1a'\n"


def test_a_host_whose_profile_is_auto_plans_its_reading_without_the_builds():
    """The profile of an "auto" host is chosen from the host's one reading: its builds' keys
    cannot be planned before it, and planning must not fail on it."""
    data = resolve(SETTINGS, {**_data(), "hardware_profile": "auto"})
    assert not any(part.fact is sb_facts.SourceBuilds for part in reading.planned(data))
    named = resolve(SETTINGS, _data())
    assert any(part.fact is sb_facts.SourceBuilds for part in reading.planned(named))


def _run_fact(tmp_path, monkeypatch, prepare, sent: list | None = None) -> dict:
    """SourceBuilds' real command, run by dash against a real directory (the build and
    wheelhouse roots moved below ``tmp_path``), its output parsed as a deploy parses it."""
    monkeypatch.setattr(sb_catalogue, "BUILD_ROOT", str(tmp_path / "builds"))
    monkeypatch.setattr(sb_catalogue, "WHEELHOUSE", str(tmp_path / "wheelhouse"))
    work = Path(sb_catalogue.work_dir("lab", "0123"))
    work.mkdir(parents=True)
    Path(sb_catalogue.wheelhouse_dir("lab", "0123")).mkdir(parents=True)
    prepare(Path(sb_catalogue.build_dir("lab", "0123")), work, Path(sb_catalogue.wheelhouse_dir("lab", "0123")))
    command = sb_facts.SourceBuilds().command((("lab", "0123", "lab-ext @ file:///w/lab/"),), str(tmp_path / "venv"))
    run = subprocess.run(["dash", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    if sent is not None:  # what the host sends the controller
        sent += host_output.decoded(run.stdout.splitlines())
    return sb_facts.SourceBuilds().process(run.stdout.splitlines())["lab"]


def test_fact_reads_a_failed_builds_exit_status_from_the_host(tmp_path, monkeypatch):
    def failed(build, work, wheelhouse):
        (build / "attempt").write_text("")
        (work / "result").write_text("2\n")

    found = _run_fact(tmp_path, monkeypatch, failed)
    assert (found["state"], found["result"]) == ("failed", "2"), found


def test_fact_a_fifo_where_root_reads_a_builds_files_never_hangs_the_deploy(tmp_path, monkeypatch):
    """The owner (of the build's work directory and the wheelhouse entry) puts FIFOs where
    root reads the stamp, the result and the venv's lock: no writer ever comes, and the
    reading still ends, the FIFOs read as missing."""

    def fifos(build, work, wheelhouse):
        (build / "attempt").write_text("")
        for path in (work / "result", wheelhouse / "stamp.json"):
            os.mkfifo(path)
        (tmp_path / "venv" / "sparkrig").mkdir(parents=True)
        os.mkfifo(tmp_path / "venv" / "sparkrig" / "requirements.lock")

    found = _run_fact(tmp_path, monkeypatch, fifos)
    assert (found["state"], found["result"], found["stamp"], found["current"]) == ("failed", None, None, None), found


def test_fact_a_link_where_root_reads_a_builds_files_is_not_followed(tmp_path, monkeypatch):
    """The owner points the stamp and the result at a file only root may read (here: a
    large file of this test's): nothing of it reaches the controller."""
    secret = tmp_path / "root-only"
    secret.write_text("0" + "SECRET" * 200_000)

    def links(build, work, wheelhouse):
        (build / "attempt").write_text("")
        (work / "result").symlink_to(secret)
        (wheelhouse / "stamp.json").symlink_to(secret)

    sent: list[str] = []
    found = _run_fact(tmp_path, monkeypatch, links, sent)
    assert (found["state"], found["result"], found["stamp"]) == ("failed", None, None), found
    assert not any("SECRET" in line for line in sent), [line[:80] for line in sent]


def test_fact_a_link_in_the_middle_of_the_path_where_root_reads_is_not_followed(tmp_path, monkeypatch):
    """The owner of the wheelhouse's build directory (``wheelhouse/lab``, theirs) replaces
    its entry ``0123`` by a link to a directory only root may read, holding a stamp.json:
    root's reading sends nothing of it (a link in the last component alone was refused)."""
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "stamp.json").write_text('{"SECRET": "' + "S" * 100 + '"}\n')

    def linked_entry(build, work, wheelhouse):
        (build / "attempt").write_text("")
        wheelhouse.rmdir()
        wheelhouse.symlink_to(secret)

    sent: list[str] = []
    found = _run_fact(tmp_path, monkeypatch, linked_entry, sent)
    assert (found["state"], found["stamp"]) == ("failed", None), found
    assert not any("SECRET" in line for line in sent), sent
