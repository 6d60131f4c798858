"""
CUDA environment controls: one env file, read alike by login shells and systemd units.

The expected values are worked out here from the host itself and the settings,
independently of the code that converges (operations/cuda_env.py).
"""

from __future__ import annotations

import re
import shlex

import pytest

PROFILE_SCRIPT = "/etc/profile.d/sparkrig-cuda.sh"


def _cuda_home(host, settings) -> str:
    """The rule: /usr/local/cuda's final target, else the newest cuda-X.Y (or cuda-X), else
    the configured default."""
    if host.file("/usr/local/cuda").exists:
        return host.check_output("readlink -f /usr/local/cuda")
    versions = []
    for path in host.run("ls -d /usr/local/cuda-*").stdout.split():
        match = re.fullmatch(r"/usr/local/cuda-(\d+)(?:\.(\d+))?", path)
        if match and host.file(path).is_directory:
            versions.append(((int(match[1]), int(match[2] or -1)), path))
    return max(versions)[1] if versions else settings["cuda_env_default_home"]


@pytest.fixture
def expected(host, settings, profile) -> dict[str, str]:
    home = _cuda_home(host, settings)
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


@pytest.mark.parametrize("path_key", ["cuda_env_file", PROFILE_SCRIPT])
def test_env_files_are_root_owned_and_not_writable_by_others(host, settings, path_key):
    """Protects against privilege escalation: whoever can write these files sets PATH and
    LD_LIBRARY_PATH for every login shell and every unit that reads them, root's included."""
    path = settings.get(path_key, path_key)
    f = host.file(path)
    assert f.is_file, f"{path} is missing"
    assert (f.user, f.group) == ("root", "root")
    assert f.mode & 0o022 == 0, f"{path} has mode {f.mode:o}"
    assert f.mode & 0o004, f"{path} must stay readable by every user (mode {f.mode:o})"


def test_env_file_holds_the_expected_values(host, settings, expected):
    """Protects against stale or wrong toolchain settings: CUDA_HOME left on an old toolkit
    after an update, builds for the wrong GPU (TORCH_CUDA_ARCH_LIST), Triton without the
    system ptxas that sm_121a needs, and `uv run` re-syncing over hand-built packages."""
    command = f"set -a; . {shlex.quote(settings['cuda_env_file'])}; env"
    env = _environment(host.check_output(f"sh -c {shlex.quote(command)}"))
    _assert_sees(env, expected, settings["cuda_env_file"])


def test_login_shell_sees_the_values(host, expected):
    """Protects against a toolchain only some sessions see: a user logging in over SSH
    gets the same CUDA_HOME, PATH and settings as the units."""
    env = _environment(host.check_output("bash -lc env"))
    _assert_sees(env, expected, "login shell")


def test_systemd_unit_sees_the_values(host, settings, expected):
    """Protects against services and detached jobs that run with another toolchain than
    the shell they were started from: a unit with EnvironmentFile= sees the same values."""
    if not host.file("/run/systemd/system").is_directory:
        pytest.skip("this host does not run systemd (no /run/systemd/system)")
    with host.sudo():
        output = host.check_output(
            "systemd-run --quiet --wait --pipe --collect -p EnvironmentFile=%s /usr/bin/env",
            settings["cuda_env_file"],
        )
    _assert_sees(_environment(output), expected, "systemd unit")


def test_cuda_compiler_runs_from_a_login_shell(host, expected):
    """Protects against a PATH that names a toolkit without its tools: nvcc and the ptxas
    Triton is told to use run from a plain login shell."""
    nvcc = f"{expected['CUDA_HOME']}/bin/nvcc"
    if not host.file(nvcc).exists:
        pytest.skip(f"no CUDA toolkit on this host: {nvcc} is missing (this control runs where one is installed)")
    assert "Cuda compilation tools" in host.check_output("bash -lc 'nvcc --version'")
    assert "ptxas" in host.check_output("bash -lc '\"$TRITON_PTXAS_PATH\" --version'").lower()


# What the read-only controls above ask, read once per host before they run (reads.py).
def reads(plan, settings) -> None:
    plan.path("/usr/local/cuda")
    plan.run("readlink -f /usr/local/cuda")
    plan.run("ls -d /usr/local/cuda-*")
    for path in (plan.known("ls -d /usr/local/cuda-*") or "").split():
        plan.path(path)
    for path in (settings["cuda_env_file"], PROFILE_SCRIPT):
        plan.path(path)
    command = f"set -a; . {shlex.quote(settings['cuda_env_file'])}; env"
    plan.run(f"sh -c {shlex.quote(command)}")
    plan.run("bash -lc env")
    plan.path("/run/systemd/system")
    plan.run("systemd-run --quiet --wait --pipe --collect -p EnvironmentFile=%s /usr/bin/env",
             settings["cuda_env_file"], sudo=True)
    # CUDA_HOME as the rule says (a second round, once the links and folders are read).
    home = None
    cuda = plan.known_path("/usr/local/cuda")
    if cuda is not None and cuda["test -e"] == "1":
        home = plan.known("readlink -f /usr/local/cuda")
    elif cuda is not None:
        versions = []
        for path in (plan.known("ls -d /usr/local/cuda-*") or "").split():
            match = re.fullmatch(r"/usr/local/cuda-(\d+)(?:\.(\d+))?", path)
            found = plan.known_path(path)
            if match and found is not None and found["test -d"] == "1":
                versions.append(((int(match[1]), int(match[2] or -1)), path))
        home = max(versions)[1] if versions else settings["cuda_env_default_home"]
    if home is not None:
        home = home.strip()
        plan.path(f"{home}/bin/nvcc")
        plan.run("bash -lc 'nvcc --version'")
        plan.run("bash -lc '\"$TRITON_PTXAS_PATH\" --version'")
