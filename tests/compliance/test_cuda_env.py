"""
CUDA environment controls: one env file, read alike by login shells and systemd units.

The expected values are worked out here from the host itself and the settings,
independently of the code that converges (operations/cuda_env/).
"""

from __future__ import annotations

import re
import shlex

import pytest

from .reads import need, system_login

PROFILE_SCRIPT = "/etc/profile.d/sparkrig-cuda.sh"


@need
def cuda_home(r) -> str:
    """The rule: /usr/local/cuda's final target, else the newest cuda-X.Y (or cuda-X), else
    the configured default."""
    # All in one round: the link's target, and the folders among /usr/local/cuda-* (test -d:
    # a link to one counts).
    cuda, target = r.path("/usr/local/cuda"), r.run("readlink -f /usr/local/cuda")
    listed = r.run('for d in /usr/local/cuda-*; do if test -d "$d"; then echo "$d"; fi; done')
    if cuda.exists:
        return target.check()
    versions = []
    for path in listed.stdout.split():
        match = re.fullmatch(r"/usr/local/cuda-(\d+)(?:\.(\d+))?", path)
        if match:
            versions.append(((int(match[1]), int(match[2] or -1)), path))
    return max(versions)[1] if versions else r.settings["cuda_env_default_home"]


@pytest.fixture
def expected(read, settings, profile) -> dict[str, str]:
    home = read(cuda_home)
    return {
        "CUDA_HOME": home,
        "LD_LIBRARY_PATH": f"{home}/lib64",
        "TORCH_CUDA_ARCH_LIST": profile["torch_cuda_arch_list"],
        "TRITON_PTXAS_PATH": f"{home}/bin/ptxas",
        "TRITON_PTXAS_BLACKWELL_PATH": f"{home}/bin/ptxas",
        "UV_NO_SYNC": "1",
        **settings["cuda_env_extra"],
        # The shared model cache is every user's Hugging Face home.
        **({"HF_HOME": settings["jobs_model_cache"]} if settings["jobs_model_cache"] else {}),
    }


def _environment(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def _assert_sees(env: dict[str, str], expected: dict[str, str], where: str):
    for name, value in expected.items():
        if name == "LD_LIBRARY_PATH":
            assert env.get(name, "").split(":")[0] == value, f"{where}: {name}={env.get(name)!r}"
        else:
            assert env.get(name) == value, f"{where}: {name}={env.get(name)!r}, expected {value!r}"
    assert env["PATH"].split(":")[0] == f"{expected['CUDA_HOME']}/bin", f"{where}: PATH={env['PATH']}"


@need
def environments(r) -> dict:
    """The env files' readings and the environment a sourced file, a login shell and a unit see."""
    env_file = r.settings["cuda_env_file"]
    command = f"set -a; . {shlex.quote(env_file)}; env"
    return {
        "files": {path: r.path(path) for path in (env_file, PROFILE_SCRIPT)},
        "sourced": r.run(f"sh -c {shlex.quote(command)}"),
        "login": r.run(system_login("env")),
        "systemd": r.path("/run/systemd/system"),
        "unit": r.run(
            "systemd-run --quiet --wait --pipe --collect -p EnvironmentFile=%s /usr/bin/env", env_file, sudo=True
        ),
    }


@need
def toolkit(r) -> dict:
    """nvcc where CUDA_HOME says, and what a login shell's nvcc and Triton's ptxas say."""
    # What needs no earlier answer first: read in the first round, beside cuda_home's reads.
    found = {
        "version": r.run(system_login("nvcc --version")),
        # Unset, it says so (it ran "" and said ": command not found").
        "ptxas": r.run(system_login('"${TRITON_PTXAS_PATH:?is not set}" --version')),
    }
    return {"nvcc": r.path(f"{cuda_home(r)}/bin/nvcc"), **found}


@pytest.mark.parametrize("path_key", ["cuda_env_file", PROFILE_SCRIPT])
def test_env_files_are_root_owned_and_not_writable_by_others(read, settings, path_key):
    """Protects against privilege escalation: whoever can write these files sets PATH and
    LD_LIBRARY_PATH for every login shell and every unit that reads them, root's included."""
    path = settings.get(path_key, path_key)
    f = read(environments)["files"][path]
    assert f.is_file, f"{path} is missing"
    assert (f.user, f.group) == ("root", "root")
    assert f.mode & 0o022 == 0, f"{path} has mode {f.mode:o}"
    assert f.mode & 0o004, f"{path} must stay readable by every user (mode {f.mode:o})"


def test_env_file_holds_the_expected_values(read, settings, expected):
    """Protects against stale or wrong toolchain settings: CUDA_HOME left on an old toolkit
    after an update, builds for the wrong GPU (TORCH_CUDA_ARCH_LIST), Triton without the
    system ptxas that sm_121a needs, and `uv run` re-syncing over hand-built packages."""
    env = _environment(read(environments)["sourced"].check())
    _assert_sees(env, expected, settings["cuda_env_file"])


def test_login_shell_sees_the_values(read, expected):
    """Protects against a toolchain only some sessions see: a user logging in over SSH
    gets the same CUDA_HOME, PATH and settings as the units."""
    env = _environment(read(environments)["login"].check())
    _assert_sees(env, expected, "login shell")


def test_systemd_unit_sees_the_values(read, expected):
    """Protects against services and detached jobs that run with another toolchain than
    the shell they were started from: a unit with EnvironmentFile= sees the same values."""
    found = read(environments)
    if not found["systemd"].is_directory:
        pytest.skip("this host does not run systemd (no /run/systemd/system)")
    _assert_sees(_environment(found["unit"].check()), expected, "systemd unit")


def test_cuda_compiler_runs_from_a_login_shell(read, expected):
    """Protects against a PATH that names a toolkit without its tools: nvcc and the ptxas
    Triton is told to use run from a plain login shell."""
    nvcc = f"{expected['CUDA_HOME']}/bin/nvcc"
    found = read(toolkit)
    if not found["nvcc"].exists:
        pytest.skip(f"no CUDA toolkit on this host: {nvcc} is missing (this control runs where one is installed)")
    assert "Cuda compilation tools" in found["version"].check()
    assert "ptxas" in found["ptxas"].check().lower()
