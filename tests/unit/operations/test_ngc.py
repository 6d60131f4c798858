"""NGC containers: settings, the Dockerfiles, the Jupyter unit and its check, the NgcHost fact,
spark-container run for real against a recording docker, and the plan for fresh, converged,
changed and disabled hosts."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkrig.operations import containers, cuda_env, hardware, jobs, ngc
from sparkrig.operations.ngc import facts as ngc_facts
from sparkrig.operations.ngc import operations as ngc_ops
from sparkrig.operations.ngc import settings as ngc_settings
from sparkrig.settings import defaults, problems
from tests.unit.pyinfra_fake import HOST_STATE, digest, execute, host_state

DEFAULTS = defaults(ngc.SETTINGS + containers.SETTINGS + cuda_env.SETTINGS + hardware.SETTINGS + jobs.SETTINGS)
BASE = "nvcr.io/nvidia/pytorch:25.09-py3@sha256:" + "a" * 64
ON = {"ngc_enabled": True, "ngc_base_image": BASE, "containers_docker_users": ["spark"], "ngc_users": ["spark"]}
JUPYTER = {**ON, "ngc_jupyter": True, "ngc_jupyter_user": "spark"}


def _data(**overrides) -> SimpleNamespace:
    return SimpleNamespace(**{**DEFAULTS, **ON, **overrides})


# Settings --------------------------------------------------------------------


def test_defaults_are_valid_and_off():
    assert problems(ngc.SETTINGS, {}) == []
    assert DEFAULTS["ngc_enabled"] is False and DEFAULTS["ngc_jupyter"] is False


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"ngc_enabled": True}, "ngc_base_image = '': allowed is an image reference pinned by digest"),
        ({"ngc_enabled": True, "ngc_base_image": "nvcr.io/nvidia/pytorch:25.09-py3"}, "pinned by digest"),
        ({"ngc_base_image": "nvcr.io/nvidia/pytorch@sha256:abc"}, "pinned by digest"),
        ({"ngc_build": "conda"}, "allowed is one of 'none', 'packages', 'unsloth'"),
        ({"ngc_pip_packages": ["datasets"]}, "pinned requirements 'name==version'"),
        ({"ngc_pip_packages": ["datasets==4.0.0; rm -rf /"]}, "pinned requirements"),
        ({"ngc_pip_packages": ["flash_attn==2.8.3"]}, "without flash-attn"),
        ({"ngc_image": "sparkrig/ngc@sha256:" + "a" * 64}, "a local image name"),
        ({"ngc_users": ["spark"]}, "each also in containers_docker_users"),
        ({"ngc_users": "spark"}, "a list of user names"),
        ({"ngc_project_mount": "/"}, "other than /"),
        ({"ngc_project_mount": "/run/secrets"}, "other than /"),
        ({"ngc_project_mount": "/workspace/my project"}, "no spaces or ':'"),
        ({"ngc_project_mount": "/workspace/p:/etc"}, "no spaces or ':'"),
        ({"ngc_hf_cache": "~alice/.cache"}, "'~/dir'"),
        ({"ngc_hf_cache": "cache/hf"}, "'~/dir'"),
        ({"ngc_outputs": "~/out puts"}, "'~/dir'"),
        ({"ngc_secrets": ["HF-TOKEN"]}, "environment variable names"),
        ({"ngc_jupyter": True}, "ngc_jupyter_user = '': allowed is one of ngc_users"),
        ({"ngc_jupyter_user": "root"}, "one of ngc_users"),
        ({"ngc_jupyter_port": 80}, "an integer from 1024 to 65535"),
        ({"ngc_jupyter_command": "jupyter lab --ip=0.0.0.0 --port={port}"}, "never 0.0.0.0"),
        ({"ngc_jupyter_command": "jupyter lab --ip=127.0.0.1 $(id)"}, "binding 127.0.0.1"),
        ({"ngc_jupyter_command": "jupyter lab"}, "binding 127.0.0.1"),
        ({"ngc_jupyter_dir": "notebooks"}, "a normalised absolute path"),
        ({"ngc_memlock_unlimited": "yes"}, "True or False"),
        ({"ngc_user": ["spark"]}, "not a sparkrig setting (did you mean ngc_users?)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(ngc.SETTINGS + containers.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


def test_a_complete_configuration_is_valid():
    data = {
        **JUPYTER,
        "ngc_build": "unsloth",
        "ngc_pip_packages": ["datasets==4.0.0", "peft[torch]==0.17.1"],
        "ngc_outputs": "/data/outputs",
        "ngc_hf_cache": "~/hf",
    }
    assert problems(ngc.SETTINGS + containers.SETTINGS, data) == []


# Templates -------------------------------------------------------------------


def test_no_build_runs_the_pinned_base_and_writes_no_dockerfile():
    data = _data()
    assert ngc_ops.render_dockerfile(data, "12.1") is None
    assert ngc_ops.run_image(data) == BASE


def test_packages_dockerfile_is_from_the_pinned_base_with_the_pins():
    data = _data(ngc_build="packages", ngc_pip_packages=["datasets==4.0.0", "peft==0.17.1"])
    text = ngc_ops.render_dockerfile(data, "12.1")
    assert f"FROM {BASE}\n" in text
    assert "RUN pip install --no-cache-dir datasets==4.0.0 peft==0.17.1\n" in text
    assert ngc_ops.run_image(data) == "sparkrig/ngc:local"
    assert "RUN" not in ngc_ops.render_dockerfile(_data(ngc_build="packages"), "12.1")


def test_every_pip_install_of_a_recipe_is_pinned_and_the_label_follows_the_pins():
    """An unpinned `pip install unsloth` gave hosts built on different days different images
    under one label: every requirement a recipe installs from an index is name==version."""
    for build in ("packages", "unsloth"):
        text = ngc_ops.render_dockerfile(_data(ngc_build=build, ngc_pip_packages=["peft==0.17.1"]), "12.1")
        for words in re.findall(r"pip install --no-cache-dir ([^\n&\\]+)", text):
            for word in words.split():
                assert word.startswith(("-", "/")) or re.fullmatch(r"[A-Za-z0-9_.\[\],-]+==[A-Za-z0-9.+!_-]+", word), (
                    word
                )
    one = ngc_ops.render_dockerfile(_data(ngc_build="unsloth"), "12.1")
    pins = [p.replace("unsloth==2025.10.1", "unsloth==2025.11.1") for p in ngc_settings.UNSLOTH_PACKAGES]
    other = ngc_ops.render_dockerfile(_data(ngc_build="unsloth", ngc_unsloth_packages=pins), "12.1")
    assert ngc_ops.recipe(one) != ngc_ops.recipe(other)
    assert problems(ngc.SETTINGS, {"ngc_unsloth_packages": ["unsloth"]})


def test_unsloth_dockerfile_is_unsloths_spark_recipe_with_the_checked_pins():
    text = ngc_ops.render_dockerfile(_data(ngc_build="unsloth"), "12.1")
    assert f"FROM {BASE}\n" in text
    assert 'ENV TORCH_CUDA_ARCH_LIST="12.1"' in text
    assert "checkout c5d671f91d90f40900027382f98b17a3e04045f6" in text
    assert "--branch v0.0.33" in text
    assert "bitsandbytes==0.48.0 transformers==4.56.2 trl==0.22.2" in text
    assert "flash" not in text.replace("flash-attn is not installed", "")


def test_the_recipe_follows_the_dockerfile_and_so_the_base_digest():
    one = ngc_ops.render_dockerfile(_data(ngc_build="packages"), "12.1")
    other = ngc_ops.render_dockerfile(_data(ngc_build="packages", ngc_base_image=BASE[:-1] + "b"), "12.1")
    assert ngc_ops.recipe(one) == hashlib.sha256(one.encode()).hexdigest() != ngc_ops.recipe(other)


def _validate(tmp_path: Path, text: str) -> int:
    path = tmp_path / "unit"
    path.write_text(text)
    return subprocess.run([*ngc_ops.JUPYTER_VALIDATOR, str(path)], capture_output=True).returncode


# The lab's stand-in server (inventory/lab.py), beside the default JupyterLab.
COMMANDS = [ngc_settings.JUPYTER_COMMAND, "busybox httpd -f -p 127.0.0.1:{port} -h {project}"]


@pytest.mark.parametrize("command", COMMANDS)
def test_jupyter_unit_binds_loopback_and_passes_its_validation(tmp_path, command):
    text = ngc_ops.render_jupyter_unit(_data(**JUPYTER, ngc_jupyter_command=command), "/home/spark")
    assert "--network host --secret JUPYTER_TOKEN=/var/lib/sparkrig/jupyter/token --" in text
    assert "127.0.0.1" in text and "0.0.0.0" not in text and "{port}" not in text
    assert "Restart=always\n" in text and "User=spark\n" in text
    assert _validate(tmp_path, text) == 0


@pytest.mark.parametrize(
    "bad",
    [
        ("127.0.0.1", "0.0.0.0"),
        ("--no-browser", "--no-browser $(id)"),
        ("User=spark", "User=spark; rm"),
        ("Restart=always", "Restart=no"),
        ("[Install]", "[Install]\nExecStartPost=/bin/sh"),
    ],
)
def test_jupyter_unit_validation_refuses_anything_else(tmp_path, bad):
    text = ngc_ops.render_jupyter_unit(_data(**JUPYTER), "/home/spark")
    assert bad[0] in text
    assert _validate(tmp_path, text.replace(bad[0], bad[1])) != 0


def test_a_project_mount_with_a_blank_never_reaches_the_unit():
    """A blank in ngc_project_mount would split ExecStart into two arguments (systemd splits
    at blanks): the setting refuses it before any host is contacted."""
    assert problems(ngc.SETTINGS, {"ngc_project_mount": "/workspace/a b"})
    assert not problems(ngc.SETTINGS, {"ngc_project_mount": "/workspace/ab"})


# The fact ----------------------------------------------------------------------


def test_ngc_host_parses_present_images_user_and_token():
    out = [
        "docker=1",
        "pinned=sha256:f93e",
        "built=sha256:1c2d 9f86",
        "user=1000:1000:/home/spark",
        "directory=1",
        "token=spark 600 64",
    ]
    assert ngc_facts.NgcHost().process(out) == {
        "docker": True,
        "pinned": "sha256:f93e",
        "built": {"id": "sha256:1c2d", "recipe": "9f86"},
        "user": {"uid": 1000, "gid": 1000, "home": "/home/spark"},
        "directory": True,
        "token": {"user": "spark", "mode": 0o600, "size": 64},
    }


def test_ngc_host_parses_a_bare_host():
    assert ngc_facts.NgcHost().process(["user="]) == {
        "docker": False,
        "pinned": None,
        "built": None,
        "user": None,
        "directory": False,
        "token": None,
    }
    assert ngc_facts.NgcHost().process(["built=sha256:1c2d "])["built"] == {"id": "sha256:1c2d", "recipe": ""}


def test_ngc_host_command_quotes_its_arguments():
    command = ngc_facts.NgcHost().command(pinned=BASE, built="sparkrig/ngc:local", user="spark", directory="/data/nb")
    raw = command.get_raw_value()
    assert f"docker image inspect --format 'pinned={{{{.Id}}}}' {BASE}" in raw
    assert """'built={{.Id}} {{index .Config.Labels "sparkrig.recipe"}}' sparkrig/ngc:local""" in raw
    assert "getent passwd spark" in raw and "[ -d /data/nb ]" in raw


# spark-container, run for real -------------------------------------------------------


@pytest.fixture
def launcher(tmp_path):
    """spark-container as the deploy renders it (the caller allowed), with a docker on PATH
    that records its arguments and the secret files it is handed."""
    if not shutil.which("bash"):
        pytest.skip("needs bash")
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "docker"
    fake.write_text(
        '#!/bin/bash\nprintf \'%s\\n\' "$@" > "$RECORD"\n'
        'for a in "$@"; do case $a in *:/run/secrets/*:ro) f=${a%%:/run/secrets/*}; '
        'stat -c \'%a\' "$f" >> "$RECORD.secrets"; cat "$f" >> "$RECORD.secrets"; echo >> "$RECORD.secrets";; '
        "esac; done\n"
    )
    fake.chmod(0o755)
    env_file = tmp_path / "cuda.env"
    env_file.write_text(
        "CUDA_HOME=/usr/local/cuda-13.0\nPATH=/usr/local/cuda-13.0/bin:/usr/bin:/bin\n"
        "TORCH_CUDA_ARCH_LIST=12.1a\nHF_HUB_ENABLE_HF_TRANSFER='1 2'\n"
    )
    data = _data(
        ngc_users=[me, "spark"],
        cuda_env_file=str(env_file),
        ngc_outputs="~/outputs",
        ngc_home_mounts=["~/.aws", "~/.wandb"],
        jobs_env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    script = tmp_path / "spark-container"
    script.write_text(ngc_ops.render_launcher(data))
    script.chmod(0o755)
    home = tmp_path / "home"
    project = home / "g2p"
    project.mkdir(parents=True)

    def run(*args, env=None, user_list=None):
        record = tmp_path / "record"
        environment = {
            "PATH": f"{bindir}:/usr/bin:/bin",
            "HOME": str(home),
            "RECORD": str(record),
            "XDG_RUNTIME_DIR": str(tmp_path),
            **(env or {}),
        }
        result = subprocess.run(
            [str(script), *args],
            cwd=project,
            env=environment,
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        argv = record.read_text().splitlines() if record.exists() else []
        secrets = tmp_path / "record.secrets"
        seen = secrets.read_text() if secrets.exists() else ""
        if secrets.exists():
            secrets.unlink()
        return result, argv, seen

    return SimpleNamespace(run=run, home=home, project=project, tmp=tmp_path, data=data)


def test_launcher_passes_nvidias_flags_mounts_and_portable_cuda_variables(launcher):
    result, argv, _ = launcher.run("--", "python", "src/train.py", "--max_steps", "10")
    assert result.returncode == 0, result.stderr
    joined = " ".join(argv)
    assert "run --rm --init --ipc=host --ulimit memlock=-1 --ulimit stack=67108864" in joined
    assert f"--volume {launcher.project}:/workspace/project --workdir /workspace/project" in joined
    assert f"--volume {launcher.home}/.cache/huggingface:/cache/huggingface --env HF_HOME=/cache/huggingface" in joined
    assert f"--volume {launcher.home}/outputs:/workspace/project/outputs" in joined
    assert (launcher.home / ".cache" / "huggingface").is_dir() and (launcher.home / "outputs").is_dir()
    assert f"--user {os.getuid()}:{os.getgid()}" in joined
    assert "--env TORCH_CUDA_ARCH_LIST=12.1a" in joined and "HF_HUB_ENABLE_HF_TRANSFER=1 2" in argv
    assert not any(a.startswith(("PATH=", "CUDA_HOME=")) for a in argv)
    assert argv[-5:] == [BASE, "python", "src/train.py", "--max_steps", "10"]
    if not os.path.exists("/dev/nvidiactl"):
        assert "--gpus" not in argv and "no NVIDIA GPU" in result.stderr


def test_launcher_without_a_command_starts_bash_and_can_drop_memlock(launcher, tmp_path):
    _, argv, _ = launcher.run()
    assert argv[-2:] == [BASE, "bash"]
    script = tmp_path / "no-memlock"
    script.write_text(
        ngc_ops.render_launcher(SimpleNamespace(**{**vars(launcher.data), "ngc_memlock_unlimited": False}))
    )
    script.chmod(0o755)
    assert "memlock" not in script.read_text().split("MEMLOCK=(")[1].split(")")[0]


def test_secrets_are_files_never_env_values(launcher):
    secrets_dir = launcher.home / ".config" / "sparkrig" / "secrets"
    secrets_dir.mkdir(parents=True)
    (secrets_dir / "WANDB_API_KEY").write_text("wandb-secret")
    (secrets_dir / "WANDB_API_KEY").chmod(0o600)
    result, argv, seen = launcher.run("--", "true", env={"HF_TOKEN": "hf-secret"})
    assert result.returncode == 0, result.stderr
    assert not any("hf-secret" in a or "wandb-secret" in a for a in argv)
    assert any(a.endswith(":/run/secrets/HF_TOKEN:ro") for a in argv)
    assert f"{secrets_dir}/WANDB_API_KEY:/run/secrets/WANDB_API_KEY:ro" in argv
    assert seen.split() == ["600", "hf-secret", "600", "wandb-secret"] or seen.split() == [
        "600",
        "wandb-secret",
        "600",
        "hf-secret",
    ]
    assert argv[argv.index(BASE) + 1 : argv.index(BASE) + 3] == ["sh", "-c"]
    assert argv[-2:] == ["spark-container", "true"]
    assert not list(launcher.tmp.glob("spark-container.*")), "the private directory was left behind"


def test_no_new_container_starts_while_the_host_is_draining_but_one_systemd_starts_does(launcher, tmp_path):
    drain = tmp_path / "drain"
    script = tmp_path / "draining"
    script.write_text(ngc_ops.render_launcher(launcher.data, drain=str(drain)))
    script.chmod(0o755)
    drain.write_text("since=2026-11-26 16:30:05 UTC\nwhy=rollout: reboot\n")
    environment = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "HOME": str(launcher.home),
        "RECORD": str(tmp_path / "r"),
        "XDG_RUNTIME_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [str(script), "--", "true"],
        cwd=launcher.project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert (result.returncode, result.stderr) == (
        75,
        "spark-container: this host is draining since 2026-11-26 16:30:05 "
        "UTC: it starts no new container until root runs spark-jobs undrain\n",
    )
    assert not (tmp_path / "r").exists()  # docker never ran
    in_unit = subprocess.run(
        [str(script), "--", "true"],
        cwd=launcher.project,
        capture_output=True,
        text=True,
        env={**environment, "INVOCATION_ID": "0123abcd"},
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert in_unit.returncode == 0, in_unit.stderr
    assert (tmp_path / "r").exists()


def test_a_secret_file_others_can_read_is_refused(launcher):
    secrets_dir = launcher.home / ".config" / "sparkrig" / "secrets"
    secrets_dir.mkdir(parents=True)
    (secrets_dir / "HF_TOKEN").write_text("x")
    (secrets_dir / "HF_TOKEN").chmod(0o644)
    result, argv, _ = launcher.run("--", "true")
    assert result.returncode == 2 and "mode 0600" in result.stderr and argv == []


def test_publish_binds_to_loopback_unless_all_interfaces_are_asked_for(launcher):
    _, argv, _ = launcher.run("--publish", "8000", "--publish", "8001", "--", "true")
    assert " ".join(argv).count("--publish 127.0.0.1:") == 2 and "127.0.0.1:8000:8000" in argv, argv
    _, argv, _ = launcher.run("--publish", "8000", "--publish-all-interfaces", "--", "true")
    assert "8000:8000" in argv and "127.0.0.1:8000:8000" not in argv


def test_home_mounts_are_read_only_where_present_and_jobs_env_is_passed_unless_set(launcher):
    (launcher.home / ".aws").mkdir()
    (launcher.home / ".wandb").symlink_to("/etc")
    result, argv, _ = launcher.run("--", "true")
    assert f"{launcher.home}/.aws:/tmp/.aws:ro" in argv
    assert not any(".wandb" in a for a in argv) and ".wandb is a link: not mounted" in result.stderr
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in argv
    _, argv, _ = launcher.run("--", "true", env={"PYTORCH_CUDA_ALLOC_CONF": "mine"})
    assert "PYTORCH_CUDA_ALLOC_CONF=mine" in argv


def test_the_shared_model_cache_replaces_the_users_own(launcher, tmp_path):
    script = tmp_path / "cached"
    script.write_text(
        ngc_ops.render_launcher(
            SimpleNamespace(**{**vars(launcher.data), "jobs_model_cache": str(tmp_path / "models")})
        )
    )
    assert f"HF_CACHE={tmp_path}/models\n" in script.read_text()


def test_detach_hands_the_same_launch_to_spark_run(launcher, tmp_path, monkeypatch):
    """--detach runs spark-run --detach NAME with this launcher, the options kept (the
    project made absolute, the container named for the job), the command last."""
    fake = tmp_path / "spark-run"
    fake.write_text('#!/bin/sh\nprintf \'%s\\n\' "$@" > "$RECORD.detach"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(ngc_ops, "SPARK_RUN", str(fake))
    script = tmp_path / "detaching"
    script.write_text(ngc_ops.render_launcher(launcher.data))
    script.chmod(0o755)
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(launcher.home), "RECORD": str(tmp_path / "r")}
    result = subprocess.run(
        [str(script), "--detach", "serve", "--publish", "8000", "--", "vllm", "serve", "m"],
        cwd=launcher.project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "r.detach").read_text().splitlines() == [
        "--detach",
        "serve",
        "--",
        ngc_ops.LAUNCHER,
        "--project",
        str(launcher.project),
        "--publish",
        "8000",
        "--name",
        "spark-job-serve",
        "--",
        "vllm",
        "serve",
        "m",
    ]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--publish", "0"], 2, "a TCP port"),
        (["--publish", "65536"], 2, "a TCP port"),
        (["--publish", "80", "--network", "host"], 2, "needs --network bridge"),
        (["--publish-all-interfaces"], 2, "goes with --publish"),
        (["--detach", "../x", "--", "true"], 2, "--detach needs a NAME"),
        (["--detach", "x"], 2, "--detach needs a COMMAND"),
        (["--network", "macvlan"], 2, "bridge, host or none"),
        (["--project", "/nonexistent/x"], 2, "no such project directory"),
        (["--secret", "HF_TOKEN"], 2, "NAME=/absolute/file"),
        (["--bogus"], 2, "unknown option"),
    ],
)
def test_launcher_usage_errors(launcher, args, code, message):
    result, argv, _ = launcher.run(*args)
    assert result.returncode == code and message in result.stderr and argv == []


def test_a_project_path_docker_cannot_mount_is_refused(launcher):
    odd = launcher.project / "run:2"
    odd.mkdir()
    result, argv, _ = launcher.run("--project", str(odd), "--", "true")
    assert result.returncode == 2 and "holds ':'" in result.stderr and argv == []


def test_only_the_allowed_users_may_launch(tmp_path):
    script = tmp_path / "spark-container"
    script.write_text(ngc_ops.render_launcher(_data(ngc_users=["someone-else"])))
    script.chmod(0o755)
    # Root may always launch: as root, ask as nobody (the script on stdin: pytest's
    # directories are root's alone).
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.getuid() == 0 else []
    if prefix and not shutil.which("setpriv"):
        pytest.skip("runs as root without setpriv: cannot ask as another user")
    result = subprocess.run(
        [*prefix, "bash", "-s", "--", "true"], input=script.read_text(), capture_output=True, text=True, cwd="/"
    )
    assert result.returncode == 77 and "may not launch" in result.stderr


# Plans -------------------------------------------------------------------------


NGC_HOST = "command -v docker"


def _responses(
    data: dict | None = None, *, docker=True, pinned=True, built=None, token=True, unit=None, files: dict | None = None
) -> dict:
    ns = _data(**(data or {}))
    unit = unit or ((True, True) if ns.ngc_jupyter else (False, False))
    out = ["docker=1"] if docker else []
    if pinned:
        out.append("pinned=sha256:f93e")
    if built is not None:
        out.append(f"built=sha256:1c2d {built}")
    out.append("user=1000:1000:/home/spark")
    if token:
        out.append("token=spark 600 64")
    state_files = {ngc_ops.LAUNCHER: (ngc_ops.render_launcher(ns), 0o755)}
    dockerfile = ngc_ops.render_dockerfile(ns, "12.0")
    if dockerfile:
        state_files[ngc_ops.DOCKERFILE] = dockerfile
    if ns.ngc_jupyter:
        state_files[ngc_ops.JUPYTER_UNIT_FILE] = ngc_ops.render_jupyter_unit(ns, "/home/spark")
    state_files.update(files or {})
    responses = {
        NGC_HOST: out,
        HOST_STATE: host_state(files=state_files, units={ngc_ops.JUPYTER_UNIT: unit}),
    }
    for path, spec in state_files.items():
        if spec is not None:
            text, mode = spec if isinstance(spec, tuple) else (spec, 0o644)
            responses[f"sha256sum {path}"] = digest(text, mode=mode)
    return responses


def _names(ops) -> list[str]:
    return [op.name.removeprefix("NGC training containers | ") for op in ops]


LAB_LIKE = {**JUPYTER, "hardware_profile": "rtx50"}


def test_off_by_default_reads_nothing_and_does_nothing():
    assert execute(ngc.ngc) == []


def test_converged_host_gets_no_operation():
    assert execute(ngc.ngc, data=LAB_LIKE, responses=_responses(LAB_LIKE)) == []


def test_a_fresh_host_pulls_by_digest_installs_the_launcher_and_starts_jupyter():
    responses = _responses(
        LAB_LIKE,
        pinned=False,
        token=False,
        unit=(False, False),
        files={ngc_ops.LAUNCHER: None, ngc_ops.JUPYTER_UNIT_FILE: None},
    )
    ops = execute(ngc.ngc, data=LAB_LIKE, responses=responses)
    assert _names(ops) == [
        "Pull the pinned base image (ngc_base_image)",
        "spark-container command (/usr/local/bin/spark-container)",
        "Jupyter's token (/var/lib/sparkrig/jupyter/token, 0600)",
        "Jupyter's unit (/etc/systemd/system/sparkrig-jupyter.service)",
        "Reload systemd: sparkrig-jupyter.service changed",
        "sparkrig-jupyter.service is enabled and running",
    ]
    assert ops[0].commands == [f"docker pull --quiet {BASE}"]
    token = ops[2].commands[0]
    assert token.startswith("sh -c ") and "umask 077" in token and "chmod 600" in token
    assert token.endswith("jupyter-token /var/lib/sparkrig/jupyter /var/lib/sparkrig/jupyter/token spark")


def test_a_new_base_digest_pulls_it_rewrites_the_launcher_and_restarts_jupyter():
    new = {**LAB_LIKE, "ngc_base_image": BASE[:-1] + "b"}
    responses = _responses(LAB_LIKE, pinned=False)
    ops = execute(ngc.ngc, data=new, responses=responses)
    assert _names(ops) == [
        "Pull the pinned base image (ngc_base_image)",
        "spark-container command (/usr/local/bin/spark-container)",
        "Restart sparkrig-jupyter.service: its unit, token, launcher or image changed",
    ]


def test_a_build_runs_only_when_the_recipe_differs():
    data = {**ON, "ngc_build": "packages", "ngc_pip_packages": ["datasets==4.0.0"]}
    dockerfile = ngc_ops.render_dockerfile(_data(**data), "12.1")
    assert execute(ngc.ngc, data=data, responses=_responses(data, built=ngc_ops.recipe(dockerfile))) == []
    ops = execute(ngc.ngc, data=data, responses=_responses(data, built="0" * 64))
    assert _names(ops) == ["Build ngc_image (ngc_build) on the pinned base"]
    assert ops[0].commands == [
        "systemd-run --quiet --wait --collect --pipe --unit=sparkrig-ngc-build -- docker build "
        f"--label sparkrig.recipe={ngc_ops.recipe(dockerfile)} --tag sparkrig/ngc:local "
        "--file /etc/sparkrig/ngc/Dockerfile /etc/sparkrig/ngc"
    ]


def test_a_changed_dockerfile_is_written_then_built():
    data = {**ON, "ngc_build": "unsloth"}
    ops = execute(ngc.ngc, data=data, responses=_responses(data, built=None, files={ngc_ops.DOCKERFILE: None}))
    assert _names(ops) == [
        "Dockerfile of the ngc_build image (/etc/sparkrig/ngc/Dockerfile)",
        "Build ngc_image (ngc_build) on the pinned base",
    ]
    uploaded = ops[0].uploads["/etc/sparkrig/ngc/.Dockerfile.sparkrig-new"].decode()
    assert uploaded == ngc_ops.render_dockerfile(_data(**data), "12.1")  # gb10: compute capability 12.1


def test_a_host_without_docker_yet_plans_the_pull_which_fails_if_docker_never_came():
    """On a fresh host the containers concern installs Docker in the same run: the plan
    pulls, and the pull reads the host again when it runs."""
    ops = execute(ngc.ngc, data=ON, responses=_responses(ON, docker=False, pinned=False))
    assert _names(ops) == ["Pull the pinned base image (ngc_base_image)"]
    assert "needs Docker" in ops[0].commands[0] and ops[0].commands[0].endswith("exit 1")


def test_turning_jupyter_off_stops_and_disables_it():
    ops = execute(ngc.ngc, data=ON, responses=_responses(ON, unit=(True, True)))
    assert _names(ops) == ["sparkrig-jupyter.service is stopped and disabled (ngc_jupyter is False)"]
    assert execute(ngc.ngc, data=ON, responses=_responses(ON, unit=(False, False))) == []


def test_a_token_with_the_wrong_mode_is_fixed_and_jupyter_restarted():
    responses = _responses(LAB_LIKE, token=False)
    responses[NGC_HOST] = [*responses[NGC_HOST], "token=spark 644 64"]
    ops = execute(ngc.ngc, data=LAB_LIKE, responses=responses)
    assert _names(ops) == [
        "Jupyter's token (/var/lib/sparkrig/jupyter/token, 0600)",
        "Restart sparkrig-jupyter.service: its unit, token, launcher or image changed",
    ]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser")
def test_the_token_script_never_follows_the_users_link():
    """The Jupyter user plants token -> a root file: the real script, run by sh as root, leaves
    that file as it was and makes a 0600 token file of the user's."""
    scratch = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        scratch.chmod(0o755)
        directory, shadow = scratch / "jupyter", scratch / "shadow"
        shadow.write_text("root:secret\n")
        shadow.chmod(0o640)
        directory.mkdir(mode=0o700)
        os.chown(directory, 65534, 65534)
        (directory / "token").symlink_to(shadow)
        run = subprocess.run(
            ["sh", "-c", ngc_ops.TOKEN_SCRIPT, "jupyter-token", str(directory), str(directory / "token"), "nobody"],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
        assert shadow.read_text() == "root:secret\n"
        assert (shadow.stat().st_uid, stat.S_IMODE(shadow.stat().st_mode)) == (0, 0o640)
        token = (directory / "token").lstat()
        assert stat.S_ISREG(token.st_mode) and token.st_uid == 65534 and stat.S_IMODE(token.st_mode) == 0o600
        assert len((directory / "token").read_text()) == 64
    finally:
        shutil.rmtree(scratch)


def test_ngc_alone_from_a_users_deploy_resolves_auto_without_hardware_first():
    # No hardware() before it: "auto" is resolved from the box's identity in the host's
    # reading (sparkrig.host_settings), and the Dockerfile targets the box's own GPU.
    data = {**ON, "ngc_build": "unsloth", "hardware_profile": "auto"}
    responses = _responses(data, built=None, files={ngc_ops.DOCKERFILE: None})
    responses["uname -m"] = ["x86_64", "12.0, NVIDIA GeForce RTX 5070 Ti"]
    ops = execute(ngc.ngc, data=data, responses=responses)
    uploaded = ops[0].uploads["/etc/sparkrig/ngc/.Dockerfile.sparkrig-new"].decode()
    assert uploaded == ngc_ops.render_dockerfile(_data(**data), "12.0")  # rtx50, chosen by "auto"


def test_ngc_alone_on_a_box_auto_cannot_place_refuses_it_saying_why():
    data = {**ON, "hardware_profile": "auto"}
    responses = {**_responses(data), "uname -m": ["x86_64"]}  # no GPU visible: hopper or rtx50
    (op,) = execute(ngc.ngc, data=data, responses=responses)
    assert op.name.endswith("The box's hardware profile is known")
    assert "ngc needs the hardware profile of the box" in op.commands[0]
    assert "cannot choose between hopper, rtx50" in op.commands[0]
