"""Python stack: the manifest and settings checks, requirements.in, the fact, and the plan for
fresh, converged, bumped, drifted and refused hosts."""

from __future__ import annotations

import copy
import hashlib

import pytest

from operations import hardware
from operations import python_stack as ps
from operations.settings import SettingsError, defaults, problems, validate_hosts
from tests.unit.pyinfra_fake import execute, plan

SETTINGS = ps.SETTINGS + hardware.SETTINGS
MANIFEST = ps.load_manifest()
FACT = "pip sync --no-config --offline --dry-run"


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


def test_the_shipped_manifest_pins_a_matching_cu130_stack():
    assert MANIFEST["torch"]["index_url"] == "https://download.pytorch.org/whl/cu130"
    assert MANIFEST["torch"]["packages"] == {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0"}
    assert set(MANIFEST["vllm"]["wheels"]) == {"aarch64", "x86_64"}
    assert MANIFEST["profiles"]["unsloth"] == {"bitsandbytes": "0.48.0", "transformers": "4.56.2", "trl": "0.22.2"}


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
            {"python_stack": _manifest(vllm={**MANIFEST["vllm"], "wheels": {"x86_64": MANIFEST["vllm"]["wheels"]["x86_64"]}})},
            "no {url, sha256} entry for this host's architecture aarch64",
        ),
        (
            {"python_stack": _manifest(vllm={**MANIFEST["vllm"], "wheels": {"aarch64": {"url": "https://x/v.whl", "sha256": "ABC"}}})},
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


def test_group_data_loads_the_same_manifest():
    import runpy

    from tests.support import REPO

    assert runpy.run_path(str(REPO / "group_data" / "all.py"))["python_stack"] == MANIFEST


# requirements.in ---------------------------------------------------------------------


def test_requirements_pin_every_package_and_name_the_torch_index_and_the_wheel():
    text = ps.render_requirements(MANIFEST, ["unsloth"], "aarch64", "https://mirror.example/simple")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    wheel = MANIFEST["vllm"]["wheels"]["aarch64"]
    assert lines == [
        "--index-url https://mirror.example/simple",
        "--extra-index-url https://download.pytorch.org/whl/cu130",
        "bitsandbytes==0.48.0",
        "torch==2.11.0",
        "torchaudio==2.11.0",
        "torchvision==0.26.0",
        "transformers==4.56.2",
        "trl==0.22.2",
        f"vllm @ {wheel['url']} --hash=sha256:{wheel['sha256']}",
    ]


def test_requirements_take_the_wheel_of_the_hosts_architecture_or_the_index_version():
    x86 = ps.render_requirements(MANIFEST, [], "x86_64", "https://pypi.org/simple")
    assert MANIFEST["vllm"]["wheels"]["x86_64"]["url"] in x86
    assert "aarch64" not in x86
    indexed = _manifest(vllm={"name": "vllm", "version": "0.20.2"}, torch=None)
    text = ps.render_requirements(indexed, [], "x86_64", "https://pypi.org/simple")
    assert "vllm==0.20.2" in text.splitlines()
    assert "--extra-index-url" not in text


def test_uv_requirements_carry_every_hash():
    text = ps.render_uv_requirements("0.13.9", ["a" * 64, "b" * 64])
    body = " ".join(line.strip(" \\") for line in text.splitlines() if not line.startswith("#"))
    assert body == f"uv==0.13.9 --hash=sha256:{'a' * 64} --hash=sha256:{'b' * 64}"


# The fact ------------------------------------------------------------------------------


def _fact_output(requirements: str | None = None, **changes) -> list[str]:
    wanted = hashlib.sha256((requirements or _wanted()).encode()).hexdigest()
    state = {
        "uv": "0.13.9", "link": ps.UV, "link_exists": "yes", "venv_module": "yes",
        "cache_owner": "root", "owner_exists": "yes", "occupied": "yes", "python": "3.12.3", "owner": "root",
        "usable": "yes", "input": wanted, "locked": wanted, "plan": ps.NO_CHANGES,
    }
    state.update(changes)
    return [f"{key} {value}" for key, value in state.items() if value is not None]


def _wanted(profiles=(), arch="aarch64") -> str:
    return ps.render_requirements(MANIFEST, list(profiles), arch, "https://pypi.org/simple")


def test_fact_reads_every_field():
    found = ps.PythonStack().process(_fact_output(plan="Would install 2 packages"))
    assert found["uv"] == "0.13.9" and found["link_exists"] is True and found["usable"] is True
    assert found["python"] == "3.12.3" and found["plan"] == "Would install 2 packages"
    assert ps.PythonStack().process([]) == ps.PythonStack.default()


def test_fact_command_quotes_the_venv_and_owner():
    command = ps.PythonStack().command("/opt/my venv", "spark").get_raw_value()
    assert command.startswith("v='/opt/my venv'; o=spark;")
    assert 'runuser -u "$o" -- env UV_SYSTEM_CERTS=1' in command


# The plan ------------------------------------------------------------------------------


def _ops(responses_output: list[str], **data):
    return execute(ps.python_stack, data=data, responses={FACT: responses_output})


def test_a_converged_host_gets_no_operation():
    assert _ops(_fact_output()) == []


def test_a_fresh_host_gets_venv_support_uv_and_the_venv():
    fresh = ["owner_exists yes"]  # nothing else: no venv module, no uv, no venv
    ops = execute(ps.python_stack, data={"python_venv_owner": "spark"}, responses={FACT: fresh})
    names = [op.name for op in ops]
    assert names[0].startswith("Python stack | Install python3-venv")
    assert "uv-requirements.txt" in names[1] and names[2] == "Python stack | uv in /opt/sparkrig/uv"
    uv_commands = " ".join(ops[2].commands)
    assert "--require-hashes --only-binary :all: --index-url https://pypi.org/simple" in uv_commands
    assert "ln -s /opt/sparkrig/uv/bin/uv /usr/local/bin/uv" in uv_commands
    venv = ops[3]
    joined = "\n".join(venv.commands)
    assert "chown -R spark: /var/cache/sparkrig/uv" in joined
    assert "runuser -u spark -- env UV_SYSTEM_CERTS=1" in joined
    assert "uv venv --no-config --clear --python 3.12 --python-preference system /opt/sparkrig/venv" in joined
    assert "pip compile --no-config --quiet --generate-hashes --emit-index-url" in joined
    assert "pip sync --no-config --quiet --require-hashes" in joined
    (upload,) = venv.uploads.values()
    assert upload.decode() == _wanted()


def test_a_changed_pin_rewrites_the_input_relocks_and_syncs_without_a_new_venv():
    old = _wanted()
    ops = _ops(_fact_output(requirements=old), hardware_profile="gb10", python_stack_profiles=["unsloth"])
    (venv,) = ops
    assert venv.name.startswith("Python stack | Virtualenv python_venv_path")
    joined = "\n".join(venv.commands)
    assert "uv venv" not in joined
    assert "pip compile" in joined and "pip sync" in joined
    assert "bitsandbytes==0.48.0" in list(venv.uploads.values())[0].decode()


def test_drift_found_by_the_dry_run_only_syncs():
    (venv,) = _ops(_fact_output(plan="Would uninstall 1 package"))
    assert len(venv.commands) == 1 and "pip sync" in venv.commands[0] and not venv.uploads


def test_a_venv_of_another_python_is_made_anew():
    (venv,) = _ops(_fact_output(python="3.11.2"))
    assert "uv venv --no-config --clear --python 3.12" in "\n".join(venv.commands)


def test_a_non_venv_directory_is_refused_not_cleared():
    (venv,) = _ops(_fact_output(python=None, owner=None, usable=None, input=None, locked=None, plan=None))
    assert len(venv.commands) == 1
    assert "is a non-empty directory but no virtualenv" in venv.commands[0]
    assert venv.commands[0].endswith("exit 1")


def test_a_new_uv_pin_reinstalls_uv_only_and_keeps_a_foreign_link():
    ops = _ops(_fact_output(uv="0.12.0", link="/home/spark/.local/bin/uv"), python_uv_version="0.13.9")
    assert [op.name.split(" | ")[1].split(" ")[0] for op in ops] == ["uv", "uv"]
    assert not any("ln -s" in c for c in ops[1].commands)


def test_plan_without_execution_agrees():
    assert plan(ps.python_stack, responses={FACT: _fact_output()}) == []


def test_an_owner_that_does_not_exist_is_refused():
    (venv,) = _ops(_fact_output(owner_exists=None), python_venv_owner="ghost")
    assert venv.commands == [
        "echo 'sparkrig: python_venv_owner ghost is no user on this host: create it first' >&2; exit 1"
    ]
