"""CUDA environment: the fact, CUDA_HOME resolution, the env file, the login-shell script."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import subprocess

import pytest

from sparkrig import rendering
from sparkrig.operations import cuda_env as ce
from sparkrig.operations.cuda_env import facts as ce_facts
from sparkrig.operations.cuda_env import operations as ce_ops
from tests.unit.pyinfra_fake import HOST_STATE, host_state, plan

# Outputs of CudaToolkits' command recorded on real machines.
# The lent H200 (Ubuntu 24.04): /usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-13.0,
# and Ubuntu's per-major /usr/local/cuda-13 beside it.
DEVICE_H200 = ["link /usr/local/cuda-13.0", "toolkit /usr/local/cuda-13.0", "toolkit /usr/local/cuda-13"]
UPDATED_SPARK = ["link /usr/local/cuda-13.1", "toolkit /usr/local/cuda-13.0", "toolkit /usr/local/cuda-13.1"]
NO_LINK = ["toolkit /usr/local/cuda-12.9", "toolkit /usr/local/cuda-13.0", "toolkit /usr/local/cuda-12.10"]
NO_CUDA: list[str] = []


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (DEVICE_H200, {"link": "/usr/local/cuda-13.0", "toolkits": ["/usr/local/cuda-13", "/usr/local/cuda-13.0"]}),
        (UPDATED_SPARK, {"link": "/usr/local/cuda-13.1", "toolkits": ["/usr/local/cuda-13.0", "/usr/local/cuda-13.1"]}),
        (
            NO_LINK,
            {"link": None, "toolkits": ["/usr/local/cuda-12.9", "/usr/local/cuda-12.10", "/usr/local/cuda-13.0"]},
        ),
        (NO_CUDA, {"link": None, "toolkits": []}),
    ],
)
def test_fact_parses_recorded_outputs(output, expected):
    assert ce_facts.CudaToolkits().process(output) == expected


def test_fact_command_run_here_agrees_with_python():
    """The real command on this machine (which may or may not have CUDA) against os.path."""
    result = subprocess.run(["sh", "-c", ce_facts.CudaToolkits().command()], capture_output=True, text=True)
    assert result.returncode == 0
    link = os.path.realpath("/usr/local/cuda") if os.path.exists("/usr/local/cuda") else None
    toolkits = sorted((p.rstrip("/") for p in glob.glob("/usr/local/cuda-*/")), key=ce_facts.toolkit_version)
    assert ce_facts.CudaToolkits().process(result.stdout.splitlines()) == {"link": link, "toolkits": toolkits}


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (DEVICE_H200, "/usr/local/cuda-13.0"),
        (UPDATED_SPARK, "/usr/local/cuda-13.1"),  # the link wins, never a hard-coded 13.0
        (NO_LINK, "/usr/local/cuda-13.0"),  # newest by version, not by string order
        (["toolkit /usr/local/cuda-13.0", "toolkit /usr/local/cuda-local"], "/usr/local/cuda-13.0"),
        (["toolkit /usr/local/cuda-local"], "/opt/default"),
        (["toolkit /usr/local/cuda-13"], "/usr/local/cuda-13"),
        (["toolkit /usr/local/cuda-13", "toolkit /usr/local/cuda-13.1"], "/usr/local/cuda-13.1"),
        (NO_CUDA, "/opt/default"),
    ],
)
def test_cuda_home_resolution(output, expected):
    assert ce_ops.resolve_cuda_home(ce_facts.CudaToolkits().process(output), "/opt/default") == expected


def test_env_variables_in_fixed_order_with_extras_sorted_after():
    variables = ce_ops.env_variables(
        "/usr/local/cuda-13.0", "12.1a", {"ZED": "1", "HF_HOME": "/data/hf"}, "/home/spark/venv"
    )
    assert variables == [
        ("CUDA_HOME", "/usr/local/cuda-13.0"),
        ("PATH", "/usr/local/cuda-13.0/bin:" + ce_ops.BASE_PATH),
        ("LD_LIBRARY_PATH", "/usr/local/cuda-13.0/lib64"),
        ("TORCH_CUDA_ARCH_LIST", "12.1a"),
        ("TRITON_PTXAS_PATH", "/usr/local/cuda-13.0/bin/ptxas"),
        ("TRITON_PTXAS_BLACKWELL_PATH", "/usr/local/cuda-13.0/bin/ptxas"),
        ("UV_NO_SYNC", "1"),
        ("UV_PROJECT_ENVIRONMENT", "/home/spark/venv"),
        ("HF_HOME", "/data/hf"),
        ("ZED", "1"),
    ]


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("/usr/local/cuda", "/usr/local/cuda"),
        ("9.0;12.0+PTX", "'9.0;12.0+PTX'"),
        ("a b", "'a b'"),
        ("$HOME", "'$HOME'"),
        ("~/x", "'~/x'"),
        ("", ""),
    ],
)
def test_env_quote(value, quoted):
    assert rendering.quote_literal(value) == quoted


def _sourced(env_file, *names, shell="sh", env=None):
    script = f"set -a; . '{env_file}'; " + "; ".join(f'printf "%s\\n" "${n}"' for n in names)
    return subprocess.run(
        [shell, "-c", script], capture_output=True, text=True, check=True, env=env or {}
    ).stdout.splitlines()


def test_env_file_values_read_back_literally_by_sh(tmp_path):
    extra = {"WEIRD": "a b;c $HOME `x` \\n", "EMPTY": ""}
    variables = ce_ops.env_variables("/usr/local/cuda-13.0", "9.0;12.0+PTX", extra)
    env_file = tmp_path / "cuda.env"
    env_file.write_text(ce_ops.render_env_file(variables))
    names = [name for name, _ in variables]
    assert _sourced(env_file, *names) == [value for _, value in variables]


def _login(tmp_path, shell, before: dict[str, str], *names):
    env_file = tmp_path / "cuda.env"
    env_file.write_text(ce_ops.render_env_file(ce_ops.env_variables("/usr/local/cuda-13.0", "12.1a", {})))
    profile = tmp_path / "profile.sh"
    profile.write_text(ce_ops.render_profile_script(str(env_file)))
    script = f". '{profile}'; " + "; ".join(f'printf "%s\\n" "${{{n}-<unset>}}"' for n in names)
    script += "; case $- in *a*) echo allexport-on;; *) echo allexport-off;; esac"
    script += '; printf "[%s]\\n" "$IFS"; type _sparkrig_merge >/dev/null 2>&1 && echo leaked || echo clean'
    result = subprocess.run([shell, "-c", script], capture_output=True, text=True, env=before)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("shell", ["sh", "bash", "dash"])
def test_login_shell_gets_the_file_with_its_own_path_kept(tmp_path, shell):
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed on this machine")
    before = {"PATH": "/home/me/.local/bin:/usr/bin:/bin:/usr/local/cuda-13.0/bin", "LD_LIBRARY_PATH": "/opt/lib"}
    out = _login(tmp_path, shell, before, "CUDA_HOME", "PATH", "LD_LIBRARY_PATH", "UV_NO_SYNC")
    assert out[0] == "/usr/local/cuda-13.0"
    assert out[1] == "/usr/local/cuda-13.0/bin:" + ce_ops.BASE_PATH + ":/home/me/.local/bin"
    assert out[2] == "/usr/local/cuda-13.0/lib64:/opt/lib"
    assert out[3] == "1"
    assert out[4:] == ["allexport-off", "[ \t", "]", "clean"]


def test_login_shell_without_ld_library_path_gets_only_cuda_lib64(tmp_path):
    out = _login(tmp_path, "sh", {"PATH": "/usr/bin:/bin"}, "LD_LIBRARY_PATH")
    assert out[0] == "/usr/local/cuda-13.0/lib64"


def test_profile_script_does_nothing_without_the_env_file(tmp_path):
    profile = tmp_path / "profile.sh"
    profile.write_text(ce_ops.render_profile_script(str(tmp_path / "missing.env")))
    result = subprocess.run(
        ["sh", "-c", f". '{profile}'; echo \"$PATH|${{CUDA_HOME-unset}}\""],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.stdout.strip() == "/usr/bin:/bin|unset"


def _digest(text: str, mode=0o644) -> list[str]:
    return [f"{mode:o} root root", f"{hashlib.sha256(text.encode()).hexdigest()}  /path"]


def _files(env=None, profile=None, env_mode=0o644) -> dict:
    """The concern's one HostState read of both files, and each file's FileDigest (read by
    the file operations it adds)."""
    files = {
        "/etc/sparkrig/cuda.env": None if env is None else (env, env_mode),
        "/etc/profile.d/sparkrig-cuda.sh": profile,
    }
    responses = {HOST_STATE: host_state(files=files)}
    if env is not None:
        responses["sha256sum /etc/sparkrig/cuda.env"] = _digest(env, mode=env_mode)
    if profile is not None:
        responses["sha256sum /etc/profile.d/sparkrig-cuda.sh"] = _digest(profile)
    return responses


def test_first_run_uploads_both_files_beside_their_destination_and_validates_them():
    ops = plan(ce.cuda_env, data={"hardware_profile": "rtx50"}, responses={"readlink -f /usr/local/cuda": DEVICE_H200})
    assert [op.name for op in ops] == [
        "CUDA environment | CUDA env file (cuda_env_file)",
        "CUDA environment | Login shells read the CUDA env file (/etc/profile.d/sparkrig-cuda.sh)",
    ]
    env_file = ops[0].uploads["/etc/sparkrig/.cuda.env.sparkrig-new"].decode()
    assert "CUDA_HOME=/usr/local/cuda-13.0\n" in env_file
    assert "TORCH_CUDA_ARCH_LIST=12.0\n" in env_file
    assert ops[0].commands == [
        "mkdir -p /etc/sparkrig",
        "chown root:root /etc/sparkrig/.cuda.env.sparkrig-new && chmod 644 "
        "/etc/sparkrig/.cuda.env.sparkrig-new && { sh -n /etc/sparkrig/.cuda.env.sparkrig-new || "
        "{ rm -f /etc/sparkrig/.cuda.env.sparkrig-new ; false; }; } && mv -f "
        "/etc/sparkrig/.cuda.env.sparkrig-new /etc/sparkrig/cuda.env",
    ]
    assert list(ops[1].uploads) == ["/etc/profile.d/.sparkrig-cuda.sh.sparkrig-new"]


def test_auto_alone_walks_the_boxs_profile_into_the_env_file():
    """cuda_env() from a user's deploy, no hardware() first: "auto" is resolved from the box's
    reading (sparkrig.host_settings) and its arch list reaches /etc/sparkrig/cuda.env."""
    ops = plan(
        ce.cuda_env,
        data={"hardware_profile": "auto"},
        responses={"readlink -f /usr/local/cuda": DEVICE_H200, "uname -m": ["x86_64", "9.0, NVIDIA H200"]},
    )
    env_file = ops[0].uploads["/etc/sparkrig/.cuda.env.sparkrig-new"].decode()
    assert "TORCH_CUDA_ARCH_LIST=9.0\n" in env_file  # hopper, the one profile of an x86_64 sm_90 box


def test_converged_host_gets_no_operation():
    env_text = ce_ops.render_env_file(ce_ops.env_variables("/usr/local/cuda-13.0", "12.1a", {}))
    profile_text = ce_ops.render_profile_script("/etc/sparkrig/cuda.env")
    ops = plan(
        ce.cuda_env,
        responses={
            "readlink -f /usr/local/cuda": DEVICE_H200,
            **_files(env_text, profile_text),
        },
    )
    assert ops == []


def test_cuda_update_rewrites_the_env_file_only():
    old_text = ce_ops.render_env_file(ce_ops.env_variables("/usr/local/cuda-13.0", "12.1a", {}))
    profile_text = ce_ops.render_profile_script("/etc/sparkrig/cuda.env")
    ops = plan(
        ce.cuda_env,
        responses={
            "readlink -f /usr/local/cuda": UPDATED_SPARK,
            **_files(old_text, profile_text),
        },
    )
    assert [op.name for op in ops] == ["CUDA environment | CUDA env file (cuda_env_file)"]
    new_text = ops[0].uploads["/etc/sparkrig/.cuda.env.sparkrig-new"].decode()
    assert "CUDA_HOME=/usr/local/cuda-13.1\n" in new_text
    assert not ops[0].commands[0].startswith("mkdir")  # the file existed


def test_wrong_mode_only_is_fixed_without_rewriting():
    env_text = ce_ops.render_env_file(ce_ops.env_variables("/usr/local/cuda", "12.1a", {}))
    profile_text = ce_ops.render_profile_script("/etc/sparkrig/cuda.env")
    ops = plan(ce.cuda_env, responses=_files(env_text, profile_text, env_mode=0o600))
    assert len(ops) == 1 and ops[0].uploads == {}
    assert ops[0].commands == ["chown root:root /etc/sparkrig/cuda.env && chmod 644 /etc/sparkrig/cuda.env"]


def test_extra_variables_and_env_file_path_come_from_settings():
    ops = plan(ce.cuda_env, data={"cuda_env_file": "/opt/sr/env", "cuda_env_extra": {"HF_HOME": "/data/hf x"}})
    assert "HF_HOME='/data/hf x'\n" in ops[0].uploads["/opt/sr/.env.sparkrig-new"].decode()
    assert "'/opt/sr/env'" in ops[1].uploads["/etc/profile.d/.sparkrig-cuda.sh.sparkrig-new"].decode()


def test_the_link_wins_over_a_newer_toolkit_beside_it_run_here(tmp_path, monkeypatch):
    """The fact's real shell against a real tree: /usr/local/cuda leads (through a second
    link, as update-alternatives makes it) to 12.8 while 13.1 sits beside it; 12.8 wins."""
    local = tmp_path / "usr" / "local"
    for version in ("12.8", "13.1", "13.0"):
        (local / f"cuda-{version}" / "bin").mkdir(parents=True)
    (tmp_path / "alternatives").mkdir()
    (tmp_path / "alternatives" / "cuda").symlink_to(local / "cuda-12.8")
    (local / "cuda").symlink_to(tmp_path / "alternatives" / "cuda")
    monkeypatch.setattr(ce_facts, "CUDA_LINK", str(local / "cuda"))
    result = subprocess.run(["sh", "-c", ce_facts.CudaToolkits().command()], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = ce_facts.CudaToolkits().process(result.stdout.splitlines())
    assert found["toolkits"] == [str(local / f"cuda-{v}") for v in ("12.8", "13.0", "13.1")]
    assert ce_ops.resolve_cuda_home(found, "/opt/default") == str(local / "cuda-12.8")
    # Without the link the newest toolkit wins; with a dangling one, too.
    (tmp_path / "alternatives" / "cuda").unlink()
    (tmp_path / "alternatives" / "cuda").symlink_to(local / "cuda-gone")
    result = subprocess.run(["sh", "-c", ce_facts.CudaToolkits().command()], capture_output=True, text=True)
    assert ce_ops.resolve_cuda_home(ce_facts.CudaToolkits().process(result.stdout.splitlines()), "/x") == str(
        local / "cuda-13.1"
    )


def test_the_ptxas_control_on_a_host_without_the_variable_says_it_is_not_set():
    """A login shell here (this machine's /etc/profile sets no TRITON_PTXAS_PATH) runs the
    control's own read: it said `bash: line 1: : command not found` on the lent GPU machine."""
    from tests.compliance import reads, test_cuda_env  # noqa: PLC0415 - testinfra, only here

    if (
        "TRITON_PTXAS_PATH"
        in subprocess.run(["sh", "-c", ". /etc/profile; env"], capture_output=True, text=True).stdout
    ):
        pytest.skip("this machine's /etc/profile sets TRITON_PTXAS_PATH")
    asked = reads.Reader("spark", {}, {})
    with contextlib.suppress(reads.Pending):  # CUDA_HOME's read is asked after the ptxas one
        test_cuda_env.toolkit(asked)
    text = next(command for command in asked.wanted if "TRITON_PTXAS_PATH" in command)
    ran = subprocess.run(["sh", "-c", text], capture_output=True, cwd="/", env={"PATH": os.environ["PATH"]})
    with pytest.raises(AssertionError, match="TRITON_PTXAS_PATH: is not set"):
        reads.Answer({text: (ran.returncode, ran.stdout, ran.stderr)}, text, "ptxas").check()
