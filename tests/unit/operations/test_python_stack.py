"""Python stack: the manifest and settings checks, requirements.in, the fact, and the plan for
fresh, converged, bumped, drifted and refused hosts."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from sparkrig import python_wheels
from sparkrig import stack_locks as ps_locks
from sparkrig.operations import hardware
from sparkrig.operations.python_stack import deploy as ps_deploy
from sparkrig.operations.python_stack import facts as ps_facts
from sparkrig.operations.python_stack import operations as ps_ops
from sparkrig.operations.python_stack import settings as ps_settings
from sparkrig.settings import SettingsError, problems, validate_hosts
from sparkrig.tools import python_lock
from sparkrig.venv import UV
from tests.repo.test_architecture import pythons_without_isolation
from tests.support import REPO
from tests.unit import pyinfra_fake
from tests.unit.pyinfra_fake import execute, plan

SETTINGS = ps_settings.SETTINGS + ps_locks.SETTINGS + hardware.SETTINGS
MANIFEST = ps_locks.load_manifest()
FACT = "sparkrig-dists"  # PythonStack's command


def _problems(**data):
    return problems(SETTINGS, data)


def _manifest(**changes):
    manifest = copy.deepcopy(MANIFEST)
    manifest.update(changes)
    return manifest


# Settings and the manifest -----------------------------------------------------------


def test_defaults_and_the_shipped_manifest_are_valid():
    assert _problems() == []
    assert _problems(hardware_profile="rtx50") == []
    assert _problems(python_stack_profiles=["unsloth"]) == []


def test_the_shipped_manifest_pins_a_matching_cu130_stack_from_pypi():
    assert MANIFEST["torch"]["index_url"] is None  # PyPI's torch 2.11.0 is the CUDA 13.0 build
    assert MANIFEST["torch"]["packages"] == {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0"}
    assert set(MANIFEST["vllm"]["wheels"]) == {"aarch64", "x86_64"}
    assert MANIFEST["profiles"]["unsloth"] == {
        "bitsandbytes": "0.48.0",
        "transformers": "4.56.2",
        "trl": "0.22.2",
        "unsloth": "2025.10.1",
        "unsloth_zoo": "2025.11.2",
    }
    assert MANIFEST["locks"] == {"architectures": ["aarch64", "x86_64"], "profiles": [[], ["unsloth"]]}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"python_stack": _manifest(packages={"flash-attn": "2.8.3"})}, "flash-attn is never installed"),
        ({"python_stack": _manifest(packages={"Flash_Attn": "2.8.3"})}, "is never installed"),
        ({"python_stack": _manifest(python=3.12)}, "quoted major.minor"),
        ({"python_stack": _manifest(packages={"numpy": 2.1})}, "numpy needs an exact version as a quoted"),
        ({"python_stack": _manifest(colour="red")}, "unknown manifest keys: colour"),
        ({"python_stack": _manifest(torch={"index_url": "auto", "packages": {}})}, "never uv's 'auto'"),
        (
            {
                "python_stack": _manifest(
                    torch={
                        "index_url": "https://download.pytorch.org/whl/cu130",
                        "packages": {"torch": "2.11.0", "numpy": "2.3.5"},
                    }
                )
            },
            "torch.index_url would send numpy to the torch index",
        ),
        ({"python_stack": _manifest(locks={"architectures": ["arm64"], "profiles": [[]]})}, "locks.architectures"),
        (
            {"python_stack": _manifest(locks={"architectures": ["x86_64"], "profiles": [["nightly"]]})},
            "locks.profiles names 'nightly'",
        ),
        ({"python_stack_locks": "/nonexistent/locks"}, "aarch64-py3.12.txt is missing: run `uv run sparkrig lock"),
        (
            {"python_stack": _manifest(packages={"six": "1.17.0"})},
            "group_data/python_stack.locks/aarch64-py3.12.txt is stale for its manifest: run `uv run sparkrig lock`",
        ),
        (
            {"python_stack": _manifest(locks={"architectures": ["x86_64"], "profiles": [[]]})},
            "the manifest's locks list no lock for aarch64 with profiles []",
        ),
        (
            {
                "python_stack": _manifest(
                    vllm={**MANIFEST["vllm"], "wheels": {"x86_64": MANIFEST["vllm"]["wheels"]["x86_64"]}}
                )
            },
            "no {url, sha256} entry for this host's architecture aarch64",
        ),
        (
            {
                "python_stack": _manifest(
                    vllm={**MANIFEST["vllm"], "wheels": {"aarch64": {"url": "https://x/v.whl", "sha256": "ABC"}}}
                )
            },
            "sha256 must be 64 lower-case hex digits",
        ),
        (
            {"python_stack": _manifest(packages={"transformers": "4.57.0"}), "python_stack_profiles": ["unsloth"]},
            "transformers is pinned to 4.57.0 in packages and to 4.56.2 in profiles.unsloth",
        ),
        ({"python_stack_profiles": ["nightly"]}, "a list of profiles of python_stack: unsloth"),
        ({"python_venv_path": "opt/venv"}, "normalised absolute path"),
        ({"python_venv_owner": "Spark User"}, "a user name"),
        ({"python_venv_python_preference": "download"}, "one of 'only-system', 'system'"),
        ({"python_index_url": "pypi.org/simple"}, "an http(s) URL of a package index"),
        ({"python_uv_version": "latest"}, "a uv release as X.Y.Z"),
        ({"python_uv_sha256": []}, "a non-empty list of sha256 digests"),
        ({"python_venv_ownr": "spark"}, "not a sparkrig setting (did you mean python_venv_owner?)"),
    ],
)
def test_bad_values_are_refused_with_what_is_allowed(data, expected):
    found = "\n".join(_problems(**data))
    assert expected in found, found


def test_one_error_names_the_host_the_key_and_what_is_allowed():
    with pytest.raises(SettingsError) as error:
        validate_hosts([("spark-02", {"python_stack": _manifest(packages={"flash_attn": "2.8.3"})})])
    message = str(error.value)
    assert "host 'spark-02': python_stack = " in message
    assert "flash_attn is never installed (no sm_121 kernels and CUDA 12 only" in message
    assert "nothing was changed on any host" in message


def test_the_default_manifest_is_group_data_python_stack_yml():
    default = next(s.default for s in ps_locks.SETTINGS if s.key == "python_stack")
    assert default == ps_locks.load_manifest(REPO / "group_data" / "python_stack.yml") == MANIFEST


def test_an_auto_host_whose_lock_leaves_a_package_to_no_enabled_build_is_refused(monkeypatch):
    """For an "auto" host the deploy asks the shared contract (sparkrig/wheelhouse.py: the
    source builds answer) what the lock leaves to a build no enabled build makes."""
    from sparkrig import wheelhouse  # noqa: PLC0415
    from sparkrig.operations.python_stack import deploy as ps_deploy  # noqa: PLC0415

    said = wheelhouse.Builds(lines=lambda _s: {}, missing=lambda _s, arch: f"xformers has no {arch} wheel")
    monkeypatch.setattr(wheelhouse, "_BUILDS", [said])
    (op,) = plan(
        ps_deploy.python_stack,
        data={"hardware_profile": "auto"},
        responses={"uname -m": ["aarch64", "12.1, NVIDIA GB10"]},
    )
    assert "python_stack: xformers has no aarch64 wheel" in op.commands[0]


# Locks ------------------------------------------------------------------------------------


def test_the_shipped_locks_are_fresh_and_hold_pypis_cuda_torch():
    for arch in ("aarch64", "x86_64"):
        for profiles in ([], ["unsloth"]):
            assert ps_locks.lock_problem(MANIFEST, arch, profiles, ps_locks.LOCKS) is None
        text = (ps_locks.locks_dir(ps_locks.LOCKS) / f"{arch}-py3.12.txt").read_text()
        entries = dict(python_wheels.lock_entries(text))
        assert entries["torch"][0] == "torch==2.11.0 \\"
        assert "    # from https://pypi.org/simple" in entries["torch"]
        assert entries["cuda-toolkit"][0].startswith("cuda-toolkit==13.0.2")
        wheel = MANIFEST["vllm"]["wheels"][arch]
        assert entries["vllm"][:2] == [f"vllm @ {wheel['url']} \\", f"    --hash=sha256:{wheel['sha256']}"]


def test_the_lock_input_follows_pins_routes_and_wheels_but_not_index_urls():
    base = ps_locks.lock_input(MANIFEST, [], "aarch64")
    assert ps_locks.lock_input(MANIFEST, [], "x86_64") != base
    assert ps_locks.lock_input(MANIFEST, ["unsloth"], "aarch64") != base
    assert ps_locks.lock_input(_manifest(python="3.11"), [], "aarch64") != base
    assert ps_locks.lock_input(_manifest(packages={"six": "1.17.0"}), [], "aarch64") != base
    routed = _manifest(torch={**MANIFEST["torch"], "index_url": "https://download.pytorch.org/whl/cu130"})
    assert ps_locks.lock_input(routed, [], "aarch64") != base
    mirror = _manifest(torch={**MANIFEST["torch"], "index_url": "https://mirror.example/cu130"})
    assert ps_locks.lock_input(mirror, [], "aarch64") == ps_locks.lock_input(routed, [], "aarch64")


def test_lock_names_key_architecture_python_and_profiles():
    assert ps_locks.lock_name(MANIFEST, [], "aarch64") == "aarch64-py3.12.txt"
    assert ps_locks.lock_name(MANIFEST, ["unsloth", "lab"], "x86_64") == "x86_64-py3.12-lab-unsloth.txt"


def test_only_the_packages_named_for_an_index_are_routed_there():
    routed = _manifest(
        torch={**MANIFEST["torch"], "index_url": "https://download.pytorch.org/whl/cu130"},
        vllm={"name": "vllm", "version": "0.20.2", "index_url": "https://wheels.vllm.example/simple"},
    )
    assert ps_locks.routes(routed) == {"torch": "torch", "torchvision": "torch", "torchaudio": "torch", "vllm": "vllm"}
    assert ps_locks.routes(MANIFEST) == {}
    text = python_lock.compile_input(routed, ["unsloth"], "aarch64")
    assert 'torch = { index = "torch" }' in text and 'vllm = { index = "vllm" }' in text
    assert text.count("explicit = true") == 2 and "transformers = {" not in text


def test_a_host_lock_is_the_controllers_lock_without_built_wheels():
    text = (ps_locks.locks_dir(ps_locks.LOCKS) / "aarch64-py3.12.txt").read_text()
    assert ps_locks.host_lock(text, {}) == text


def test_uv_requirements_carry_every_hash():
    text = ps_ops.render_uv_requirements("0.13.9", ["a" * 64, "b" * 64])
    body = " ".join(line.strip(" \\") for line in text.splitlines() if not line.startswith("#"))
    assert body == f"uv==0.13.9 --hash=sha256:{'a' * 64} --hash=sha256:{'b' * 64}"


# The fact ------------------------------------------------------------------------------


def records(lock: str, drop: str = "", extra: tuple[str, ...] = ()) -> list[str]:
    """The PythonStack fact's lines for a venv holding ``lock`` as uv installs it: a
    ``.dist-info`` per distribution, a ``direct_url.json`` for one locked by URL (less
    ``drop``, plus the entries ``extra``)."""
    names, urls = [], []
    for name, (version, url) in ps_facts.locked(lock).items():
        if name == drop:
            continue
        entry = f"{name.replace('-', '_')}-{version}.dist-info"
        names.append(entry)
        if url:
            record = base64.b64encode(json.dumps({"url": url, "archive_info": {}}).encode()).decode()
            urls.append(f"url {base64.b64encode(entry.encode()).decode()} {record}")
    listing = "".join(f"{entry}\0" for entry in [*names, *extra])
    return [f"dists {base64.b64encode(listing.encode('utf-8', 'surrogateescape')).decode()}", *urls]


def _fact_output(lock: str | None = None, installed: list[str] | None = None, **changes) -> list[str]:
    wanted = hashlib.sha256((lock or _wanted()).encode()).hexdigest()
    state = {
        "uv": "0.13.9",
        "link": UV,
        "link_exists": "yes",
        "venv_module": "yes",
        "cache_owner": "root",
        "owner_exists": "yes",
        "occupied": "yes",
        "python": "3.12.3",
        "owner": "root",
        "usable": "yes",
        "root_python": "yes",
        "lock": wanted,
    }
    state.update(changes)
    lines = [f"{key} {value}" for key, value in state.items() if value is not None]
    return lines + (records(lock or _wanted()) if installed is None else installed)


def _wanted(profiles=(), arch="aarch64") -> str:
    return (ps_locks.locks_dir(ps_locks.LOCKS) / ps_locks.lock_name(MANIFEST, profiles, arch)).read_text()


def test_fact_reads_every_field():
    found = ps_facts.PythonStack().parse(_fact_output())
    assert found["uv"] == "0.13.9" and found["link_exists"] is True and found["usable"] is True
    assert found["python"] == "3.12.3" and found["dists"]["torch"] and found["urls"]["vllm"].startswith("https://")
    assert ps_facts.PythonStack().parse([]) == ps_facts.PythonStack.default()


def test_fact_command_quotes_the_venv_and_owner():
    command = ps_facts.PythonStack().command("/opt/my venv", "spark").get_raw_value()
    assert command.startswith("{ v='/opt/my venv'; o=spark;")
    assert "runuser" not in command and "--dry-run" not in command


def test_the_fact_never_runs_the_venvs_python_as_root(tmp_path):
    """The venv's owner replaces bin/python with a script: the fact's real command (run by sh,
    as root would run it) reads the venv without running it, and still finds it usable only
    when bin/python leads to an executable file."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.12.3\n")
    marker = tmp_path / "ran-as-root"
    (venv / "bin" / "python").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (venv / "bin" / "python").chmod(0o755)
    command = ps_facts.PythonStack().command(str(venv), "nobody").get_raw_value()
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = ps_facts.PythonStack().process(run.stdout.splitlines())
    assert not marker.exists()
    assert found["python"] == "3.12.3" and found["usable"] is True
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(tmp_path / "gone")
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert ps_facts.PythonStack().process(run.stdout.splitlines())["usable"] is False


def test_the_fact_reads_the_venvs_files_without_blocking_or_following_links(tmp_path):
    """The owner makes pyvenv.cfg a FIFO and the lock a link to a large file only root may
    read: the fact's real command ends, and sends none of that file."""
    venv = tmp_path / "venv"
    (venv / "sparkrig").mkdir(parents=True)
    os.mkfifo(venv / "pyvenv.cfg")
    secret = tmp_path / "root-only"
    secret.write_text("SECRET\n" * 100_000)
    (venv / "sparkrig" / "requirements.lock").symlink_to(secret)
    command = ps_facts.PythonStack().command(str(venv), "nobody").get_raw_value()
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    found = ps_facts.PythonStack().process(run.stdout.splitlines())
    assert found["python"] is None and found["lock"] != hashlib.sha256(secret.read_bytes()).hexdigest(), found


def test_a_pyvenv_cfg_that_is_not_utf8_is_read_not_fatal():
    lines = ["python 3.12\udcff", "owner spark", "usable yes"]
    found = ps_facts.PythonStack().process(pyinfra_fake.encode(lines))
    assert found["python"] == "3.12\\xff" and ps_facts.major_minor(found["python"]) != "3.12"


# The plan ------------------------------------------------------------------------------


def _ops(responses_output: list[str], **data):
    return execute(ps_deploy.python_stack, data=data, responses={FACT: responses_output})


def test_a_converged_host_gets_no_operation():
    assert _ops(_fact_output()) == []


def test_a_fresh_host_gets_venv_support_uv_and_the_venv():
    fresh = ["owner_exists yes"]  # nothing else: no venv module, no uv, no venv
    ops = execute(ps_deploy.python_stack, data={"python_venv_owner": "spark"}, responses={FACT: fresh})
    names = [op.name for op in ops]
    assert names[0].startswith("Python stack | Install python3-venv")
    assert "uv-requirements.txt" in names[1] and names[2] == "Python stack | uv in /opt/sparkrig/uv"
    uv_commands = " ".join(ops[2].commands)
    assert "--require-hashes --only-binary :all: --index-url https://pypi.org/simple" in uv_commands
    assert "ln -s /opt/sparkrig/uv/bin/uv /usr/local/bin/uv" in uv_commands
    venv = ops[3]
    joined = "\n".join(venv.commands)
    assert "chown -hR spark: /var/cache/sparkrig/uv" in joined
    assert "runuser -u spark -- env UV_SYSTEM_CERTS=1" in joined
    assert "uv venv --no-config --clear --python 3.12 --python-preference system /opt/sparkrig/venv" in joined
    assert "pip compile" not in joined  # hosts never resolve
    assert "pip sync --no-config --quiet --require-hashes --index-url https://pypi.org/simple --python" in joined
    assert "--extra-index-url" not in joined
    (upload,) = venv.uploads.values()
    assert upload.decode() == _wanted()


def test_a_changed_lock_is_uploaded_and_synced_without_a_new_venv():
    old = _wanted()
    ops = _ops(
        _fact_output(lock=old),
        hardware_profile="gb10",
        python_stack_profiles=["unsloth"],
        source_builds_enabled=["xformers"],
    )
    (venv,) = ops
    assert venv.name.startswith("Python stack | Virtualenv python_venv_path")
    joined = "\n".join(venv.commands)
    assert "uv venv" not in joined and "pip compile" not in joined
    assert "pip sync" in joined
    assert list(venv.uploads.values())[0].decode() == _wanted(["unsloth"])


def test_drift_found_in_the_venvs_records_only_syncs():
    lock = _wanted()
    torch = ps_facts.locked(lock)["torch"][0]
    for installed in (
        records(lock, extra=("six-1.16.0.dist-info",)),  # one the lock does not name
        records(lock, drop="torch"),  # one missing
        records(lock.replace(f"torch=={torch} ", "torch==0.1 ")),  # another version
        [line for line in records(lock) if not line.startswith("url ")],  # vLLM not from its URL
        records(lock, extra=("not a\nname.dist-info",)),
        ["dists unreadable"],  # a link on the way
    ):
        (venv,) = _ops(_fact_output(installed=installed))
        assert len(venv.commands) == 1 and "pip sync" in venv.commands[0] and not venv.uploads, installed


def test_turning_python_offline_off_removes_the_controllers_wheels_once():
    """A host left with python_offline's wheels (over a GB with torch) loses them; the venv,
    which holds the same lock either way, is not touched."""
    (venv,) = _ops(_fact_output(offline_dir="yes"))
    assert venv.commands == ["rm -rf /var/lib/sparkrig/python-wheels"] and not venv.uploads
    assert _ops(_fact_output()) == []


def test_the_fact_says_whether_the_offline_wheels_are_there():
    assert ps_facts.PythonStack().parse(_fact_output(offline_dir="yes"))["offline_dir"] is True
    assert ps_facts.PythonStack().parse(_fact_output())["offline_dir"] is False
    assert (
        f"[ -d {ps_facts.OFFLINE_DIR} ]"
        in ps_facts.PythonStack().command("/opt/sparkrig/venv", "spark").get_raw_value()
    )


def test_a_venv_of_another_python_is_made_anew():
    (venv,) = _ops(_fact_output(python="3.11.2"))
    assert "uv venv --no-config --clear --python 3.12" in "\n".join(venv.commands)


def test_a_non_venv_directory_is_refused_not_cleared():
    (venv,) = _ops(_fact_output(python=None, owner=None, usable=None, lock=None, installed=[]))
    assert len(venv.commands) == 1
    assert "is a non-empty directory but no virtualenv" in venv.commands[0]
    assert venv.commands[0].endswith("exit 1")


def test_a_new_uv_pin_reinstalls_uv_only_and_keeps_a_foreign_link():
    ops = _ops(_fact_output(uv="0.12.0", link="/home/spark/.local/bin/uv"), python_uv_version="0.13.9")
    assert [op.name.split(" | ")[1].split(" ")[0] for op in ops] == ["uv", "uv"]
    assert not any("ln -s" in c for c in ops[1].commands)


def test_plan_without_execution_agrees():
    assert plan(ps_deploy.python_stack, responses={FACT: _fact_output()}) == []


def test_a_stale_lock_refuses_the_host_before_any_change():
    ops = _ops(_fact_output(), python_stack=_manifest(packages={"six": "1.17.0"}))
    assert [op.name for op in ops] == ["Python stack | The versions manifest and its lock fit this box"]
    assert "is stale for its manifest: run `uv run sparkrig lock`" in ops[0].commands[0]


def test_a_lock_needing_a_source_build_wants_it_enabled_before_any_host_is_contacted():
    # The committed aarch64 Unsloth lock leaves xformers (no aarch64 wheel) to a source build.
    assert ps_locks.lock_from_source(
        ps_locks.read_lock(ps_locks.locks_dir(ps_locks.LOCKS) / "aarch64-py3.12-unsloth.txt")
    ) == ["xformers"]
    assert (
        ps_locks.lock_from_source(ps_locks.read_lock(ps_locks.locks_dir(ps_locks.LOCKS) / "x86_64-py3.12-unsloth.txt"))
        == []
    )
    with pytest.raises(SettingsError) as error:
        validate_hosts([("spark-02", {"hardware_profile": "gb10", "python_stack_profiles": ["unsloth"]})])
    (line,) = [line for line in str(error.value).splitlines() if line.startswith("  host")]
    assert line.startswith("  host 'spark-02': source_builds_enabled = []: allowed is a list of builds")
    assert (
        "aarch64-py3.12-unsloth.txt leaves xformers to a source build (xformers has no aarch64 wheel: "
        "enable xformers)" in line
    )
    validate_hosts(
        [
            (
                "spark-02",
                {
                    "hardware_profile": "gb10",
                    "python_stack_profiles": ["unsloth"],
                    "source_builds_enabled": ["xformers"],
                },
            )
        ]
    )
    # x86_64 has PyPI's wheel; the base stack does not need xformers at all.
    validate_hosts([("ws", {"hardware_profile": "rtx50", "python_stack_profiles": ["unsloth"]})])
    validate_hosts([("spark-03", {"hardware_profile": "gb10"})])


def test_an_auto_profile_host_is_refused_at_deploy_when_its_lock_needs_a_build():
    ops = _ops(_fact_output(), hardware_profile="gb10", python_stack_profiles=["unsloth"])
    assert [op.name for op in ops] == ["Python stack | The versions manifest and its lock fit this box"]
    assert "leaves xformers to a source build (xformers has no aarch64 wheel: enable xformers)" in ops[0].commands[0]


def test_an_owner_that_does_not_exist_is_refused():
    (venv,) = _ops(_fact_output(owner_exists=None), python_venv_owner="ghost")
    assert venv.commands == [
        "echo 'sparkrig: python_venv_owner ghost is no user on this host: create it first' >&2; exit 1"
    ]


@pytest.mark.parametrize(("status", "usable"), [("ii ", True), ("iU ", False), ("iF ", False), ("", True)])
def test_venv_module_needs_python3_venv_fully_installed(tmp_path, status, usable):
    """A box that lost power while dpkg unpacked python3-venv has ensurepip's files but an
    unconfigured package: the deploy must install it again (completing dpkg), not skip it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 0\n")  # `import ensurepip` succeeds
    (bin_dir / "dpkg-query").write_text(f"#!/bin/sh\nprintf '{status}'\n[ -n '{status}' ]\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    line = next(i for i, text in enumerate(ps_facts.STACK_SCRIPT.splitlines()) if "ensurepip" in text)
    script = "\n".join(ps_facts.STACK_SCRIPT.splitlines()[line : line + 2])
    result = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert ("venv_module yes" in result.stdout) is usable


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser")
def test_requirements_reach_the_venv_as_its_owner_not_through_a_planted_link():
    """The owner points <venv>/sparkrig at a root-owned directory: the real command
    (runuser as the owner, here nobody) cannot write there; root's directory is unchanged."""
    scratch = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        scratch.chmod(0o755)
        venv, roots = scratch / "venv", scratch / "etc"
        venv.mkdir()
        roots.mkdir()
        os.chown(venv, 65534, 65534)
        (venv / "sparkrig").symlink_to(roots)
        os.lchown(venv / "sparkrig", 65534, 65534)
        staged = scratch / "staged.in"
        staged.write_text("torch==2.11.0\n")
        staged.chmod(0o644)
        run = subprocess.run(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "sh",
                "-c",
                ps_ops.PUT_AS_OWNER,
                "put",
                str(venv / "sparkrig"),
                str(staged),
                "requirements.in",
            ],
            capture_output=True,
        )
        assert run.returncode != 0 and list(roots.iterdir()) == []
        (venv / "sparkrig").unlink()
        run = subprocess.run(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "sh",
                "-c",
                ps_ops.PUT_AS_OWNER,
                "put",
                str(venv / "sparkrig"),
                str(staged),
                "requirements.in",
            ],
            capture_output=True,
        )
        assert run.returncode == 0 and (venv / "sparkrig" / "requirements.in").stat().st_uid == 65534
    finally:
        shutil.rmtree(scratch)


def test_a_fresh_venv_command_runs_its_link_check_and_goes_on(tmp_path):
    """The fresh-venv command's guard, run by sh: a directory passes, a link is refused."""
    ops = execute(ps_deploy.python_stack, data={"python_venv_owner": "spark"}, responses={FACT: ["owner_exists yes"]})
    (make,) = [c for c in ops[-1].commands if "uv venv" in c]
    guard = make.split(" && mkdir -p", 1)[0]
    target = tmp_path / "v"
    target.mkdir()
    ok = subprocess.run(
        ["sh", "-c", guard.replace("/opt/sparkrig/venv", str(target)) + " && echo on"], capture_output=True, text=True
    )
    assert ok.stdout == "on\n"
    (tmp_path / "link").symlink_to(target)
    bad = subprocess.run(
        ["sh", "-c", guard.replace("/opt/sparkrig/venv", str(tmp_path / "link")) + " && echo on"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "is a symbolic link" in bad.stderr and bad.stdout == ""


def test_offline_the_wheel_locked_by_url_is_named_by_its_uploaded_copy():
    """uv fetches no URL with --offline: vLLM's wheel, locked by its URL, is installed from the
    copy the controller uploaded (found installing the real stack in the lab)."""
    text = ps_locks.read_lock(ps_locks.locks_dir(ps_locks.LOCKS) / "x86_64-py3.12.txt")
    offline = ps_ops.offline_lock(text)
    (line,) = [line for line in offline.splitlines() if line.startswith("vllm @ ")]
    assert line == f"vllm @ file://{ps_facts.OFFLINE_DIR}/vllm-0.20.2-cp38-abi3-manylinux_2_35_x86_64.whl \\"
    assert (
        offline.count("--hash=") == text.count("--hash=")
        and "https://" not in offline.split("vllm @ ", 1)[1].split("\n")[0]
    )
    assert ps_ops.offline_lock(offline) == offline


def test_a_wheel_tagged_for_another_platform_is_no_drift():
    """Found converging the real stack on the emulated aarch64 host: NVIDIA's cuSPARSELt wheel
    (file name manylinux2014_aarch64) says `Tag: py3-none-manylinux2014_sbsa` in its WHEEL
    file, and uv's dry run reinstalled it at every sync. The records name its version: no change."""
    lock = _wanted()
    assert "nvidia-cusparselt-cu13" in ps_facts.locked(lock)
    assert ps_facts.plan_clean(ps_facts.PythonStack().parse(records(lock)), lock)
    assert _ops(_fact_output()) == []


def test_every_python_uvs_installation_starts_is_isolated():
    """uv's tool environment, as the operation renders it: its venv and its pip run with -I
    (root's working directory and environment may hold a planted module)."""
    (op,) = plan(lambda: ps_ops.uv_tool(name="uv", version="0.13.9", index_url="https://pypi.org/simple"))
    (command,) = [c for c in op.commands if "pip install" in c]
    assert "bin/python -I -m pip install" in command
    assert pythons_without_isolation([("uv_tool", command)]) == []


def _scratch_venv(tmp_path):
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.12.3\n")
    (venv / "bin").mkdir()
    marker = tmp_path / "ran"
    (venv / "bin" / "python").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (venv / "bin" / "python").chmod(0o755)
    return venv, site, marker


def test_the_fact_tells_what_the_venv_holds_from_its_records_alone(tmp_path):
    """The fact's real command (sh, as root runs it) lists the venv's .dist-info records and
    reads each direct_url.json through the one reader: a record that is a link is skipped, a
    direct_url.json that is a FIFO reads as no URL, and the venv's python never runs."""
    venv, site, marker = _scratch_venv(tmp_path)
    (site / "torch-2.11.0+cu130.dist-info").mkdir()
    (site / "vllm-0.20.2.dist-info").mkdir()
    (site / "vllm-0.20.2.dist-info" / "direct_url.json").write_text('{"url": "https://example.org/vllm.whl"}')
    (site / "six-1.17.0.dist-info").mkdir()
    os.mkfifo(site / "six-1.17.0.dist-info" / "direct_url.json")
    (site / "numpy-2.0.0.dist-info").symlink_to(tmp_path)
    (site / "evil\nurl x-1.dist-info").mkdir()
    command = ps_facts.PythonStack().command(str(venv), "nobody").get_raw_value()
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=True)
    found = ps_facts.PythonStack().process(run.stdout.splitlines())
    assert found["dists"] == {"torch": "2.11.0+cu130", "vllm": "0.20.2", "six": "1.17.0"}
    assert found["urls"] == {"vllm": "https://example.org/vllm.whl"}
    assert found["bad_dists"] == ["evil\\x0aurl x-1.dist-info"] and not marker.exists()


def test_a_link_on_the_way_to_the_venvs_records_reads_as_unreadable(tmp_path):
    venv, site, _ = _scratch_venv(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    site.rename(elsewhere)
    site.symlink_to(elsewhere)
    (elsewhere / "torch-2.11.0.dist-info").mkdir()
    command = ps_facts.PythonStack().command(str(venv), "nobody").get_raw_value()
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=True)
    found = ps_facts.PythonStack().process(run.stdout.splitlines())
    assert found["dists_unreadable"] and found["dists"] == {}
    assert not ps_facts.plan_clean(found, "torch==2.11.0\n")


def test_plan_clean_compares_names_versions_and_urls():
    lock = (
        "# header\nsix==1.17.0 \\\n    --hash=sha256:aa\n"
        "vllm @ https://example.org/p/vllm-0.20.2-cp38-abi3-x.whl \\\n    --hash=sha256:bb\n"
        "built @ file:///w/built-1.0-cp38-abi3-linux_x86_64.whl --hash=sha256:cc\n"
    )
    base = {**ps_facts.PythonStack.default(), "dists": {"six": "1.17.0", "vllm": "0.20.2", "built": "1.0"}}
    built = "file:///w/built-1.0-cp38-abi3-linux_x86_64.whl"
    good = {**base, "urls": {"vllm": "https://example.org/p/vllm-0.20.2-cp38-abi3-x.whl", "built": built}}
    assert ps_facts.plan_clean(good, lock)
    assert not ps_facts.plan_clean(base, lock)  # vLLM from an index, not its URL
    assert not ps_facts.plan_clean({**good, "urls": {**good["urls"], "six": "file:///x.whl"}}, lock)
    assert not ps_facts.plan_clean({**good, "dists": {**good["dists"], "six": "1.16.0"}}, lock)
    assert not ps_facts.plan_clean({**good, "bad_dists": ["x"]}, lock)


def test_the_sync_that_runs_the_owners_python_is_contained(tmp_path):
    """uv's sync starts the venv's python, a program of the owner's: the operation's real
    command, uv replaced by a stand-in that leaves a child holding the command's output open
    for ever (as that python could), still ends, with uv's status and output."""
    (venv,) = _ops(_fact_output(installed=records(_wanted(), drop="torch")))
    (sync,) = [command for command in venv.commands if "pip sync" in command]
    stand_in = tmp_path / "uv"
    # It also writes a file over the reading's 256 MiB cap (sparse: a wheel's CUDA library).
    stand_in.write_text(
        "#!/bin/sh\nsetsid sh -c 'while :; do echo still; sleep 1; done' &\n"
        f"echo $! >{tmp_path}/child\ntruncate -s 300M {tmp_path}/big.so || exit 9\necho synced; exit 3\n"
    )
    stand_in.chmod(0o755)
    started = time.monotonic()
    result = subprocess.run(
        ["sh", "-c", sync.replace(UV, str(stand_in))], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert time.monotonic() - started < 60  # not the 120 s the held output would cost
    assert result.returncode == 3 and "synced\n" in result.stdout, result.stderr
    assert (tmp_path / "big.so").stat().st_size == 300 << 20
    child = Path(f"/proc/{(tmp_path / 'child').read_text().strip()}/stat")
    time.sleep(0.2)
    assert not child.exists() or child.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_venv_whose_python_is_not_roots_interpreter_is_never_synced():
    """uv's sync starts bin/python as the owner: where it does not lead to an interpreter only
    root may change (the owner put a program of theirs there, one that could hold the sync for
    its hour), the host is refused, naming the venv, and nothing is synced."""
    (venv,) = _ops(_fact_output(installed=records(_wanted(), drop="torch"), root_python=None))
    joined = "\n".join(venv.commands)
    assert "pip sync" not in joined and "(its bin/ link) is not one only root may change" in joined


@pytest.mark.parametrize("kind", ["root's link", "the owner's program", "group-writable", "another owner's"])
def test_the_fact_tells_whether_the_venvs_python_is_roots_alone(tmp_path, kind):
    """The fact's real command: bin/python a link to root's python3 is root's; a program in its
    place, a group-writable interpreter or another user's is not (read, never run)."""
    if os.geteuid() != 0:
        pytest.skip("owners and modes of the interpreter: run as root")
    venv, _site, marker = _scratch_venv(tmp_path)
    python = venv / "bin" / "python"
    if kind == "root's link":
        python.unlink()
        python.symlink_to(os.path.realpath("/usr/bin/python3"))
    elif kind == "the owner's program":
        os.chown(python, 65534, 65534)
    else:
        python.unlink()
        interpreters = tmp_path / "interpreters"
        interpreters.mkdir(mode=0o755)
        tmp_path.chmod(0o755)
        real = interpreters / "python3"
        shutil.copy(os.path.realpath("/usr/bin/python3"), real)
        if kind == "group-writable":
            real.chmod(0o775)
        else:
            os.chown(real, 65534, 65534)
        python.symlink_to(real)
    command = ps_facts.PythonStack().command(str(venv), "nobody").get_raw_value()
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=True)
    found = ps_facts.PythonStack().process(run.stdout.splitlines())
    assert found["usable"] and found["root_python"] is (kind == "root's link"), kind
    assert not marker.exists()
