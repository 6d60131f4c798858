"""One shellcheck gate over every host-side script, and none left in a Python string.

Every script a host runs is a file under templates/ (``.sh``, or ``.sh.j2`` rendered by
sparkrig.rendering); this repository's own sh scripts (./try, ./test, .ci/install) too. Each
is checked with one flag set: every severity, SC1091 excluded (the env files the profile
scripts source exist on the hosts only); a script names its shell, by its #! line or, where it
runs under ``sh -c``, a ``# shellcheck shell=sh`` line. A ``.sh.j2`` is rendered with the sample
below (values shaped like those the deploy passes; a new template needs one, a new variable
fails its render). Without shellcheck the gate skips, saying so, except under CI, where it
fails: CI installs it (.ci/install).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkrig import rendering
from tests.support import unavailable

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
FLAGS = ("--severity=style", "--exclude=SC1091")
# Templates only ever included by another (rendered and checked through it).
INCLUDED = {"source_builds/fetch.sh.j2": "source_builds/build.sh.j2, build-prefix.sh.j2"}
_FETCH = {"url": "https://github.com/example/project.git", "ref": "v1.0", "commit_ref": False, "submodules": True}
_BUILD = {
    **_FETCH,
    "name": "xformers",
    "key": "0123456789abcdef",
    "stamp": '{"name": "xformers"}',
    "steps": ["python use_existing_torch.py", "pip install -r requirements/build.txt"],
    "subdirectory": ".",
    "unit": "sparkrig-build-xformers",
    "build_dir": "/var/lib/sparkrig/source-builds/xformers",
    "wheelhouse_dir": "/var/lib/sparkrig/wheelhouse/xformers/0123456789abcdef",
}
SAMPLES: dict[str, dict] = {
    "cluster/link-apply.sh.j2": {
        "dir": "/var/lib/sparkrig/cluster-link",
        "loaded": "/var/lib/sparkrig/cluster-link.loaded",
        "interfaces": ["enp1s0f1np1"],
        "netplan": True,
        "networkmanager": True,
        "nm_file": "/etc/NetworkManager/conf.d/90-sparkrig-cluster.conf",
    },
    "cluster/link-rollback.sh.j2": {
        "dir": "/var/lib/sparkrig/cluster-link",
        "unit": "sparkrig-cluster-rollback",
        "paths": ["/etc/systemd/network/40-sparkrig-cluster-enp1s0f1np1.network"],
        "added": [("enp1s0f1np1", "192.168.100.11/24")],
        "networkd": "systemd-networkd.service",
        "started_networkd": True,
        "netplan": True,
        "boot_unit": "b",
        "boot_files": ["/etc/systemd/system/b.service", "/etc/systemd/system/w/b.service"],
    },
    "cluster/profile.sh.j2": {"env_file": "/etc/sparkrig/cluster.env"},
    "cluster/spark-cluster-check.sh.j2": {
        "name": "duo",
        "user": "spark",
        "mtu": 9000,
        "interfaces": ["enp1s0f1np1"],
        "env_file": "/etc/sparkrig/cluster.env",
        "hostfile": "/etc/sparkrig/cluster/hostfile",
        "nccl_tests_bin": "/opt/sparkrig/builds/nccl-tests/current/bin",
        "peers": [
            {
                "name": "spark-02",
                "interface": "enp1s0f1np1",
                "address": "192.168.100.12",
                "device": "rocep1s0f1",
                "peer_device": "rocep1s0f1",
            }
        ],
        "rail_floor": 80,
        "nccl_floor": 12,
    },
    "cuda_env/profile.sh.j2": {"env_file": "/etc/sparkrig/cuda.env"},
    "sparkrig/gpu-state.sh.j2": {
        "reason_fields": "clocks_event_reasons.active clocks_throttle_reasons.active",
        "timeout_s": 20,
        "fields": "index,name",
        "applied": "/run/sparkrig/gpu-policy.applied",
    },
    "jobs/spark-drop-caches.sh.j2": {},
    "jobs/spark-jobs.sh.j2": {
        "unit_prefix": "spark-job-",
        "records": "/var/lib/sparkrig/jobs",
        "drain": "/var/lib/sparkrig/drain",
        "serve_prefix": "spark-serve-",
    },
    "jobs/spark-preflight.sh.j2": {
        "min_available_kib": 8388608,
        "min_large_blocks": 0,
        "large_order": 9,
        "watchdog_service": "earlyoom.service",
    },
    "jobs/spark-run.sh.j2": {
        "slice": "training.slice",
        "memory_max": "90%",
        "oom_score_adj": 500,
        "drop_caches": "yes",
        "unit_prefix": "spark-job-",
        "jobs_command": "/usr/local/bin/spark-jobs",
        "self_path": "/usr/local/bin/spark-run",
        "env": [("HF_HOME", "'/srv/models'")],
        "drain": "/var/lib/sparkrig/drain",
        "min_large_blocks": 16,
        "large_order": 9,
        "compact": "yes",
        "preflight": "/usr/local/bin/spark-preflight",
    },
    "ngc/spark-container.sh.j2": {
        "image": "'nvcr.io/nvidia/pytorch:25.10-py3'",
        "memlock": "'--ulimit' 'memlock=-1'",
        "project_mount": "/workspace",
        "hf_cache": "/srv/models",
        "outputs": "/workspace/outputs",
        "cuda_env_file": "/etc/sparkrig/cuda.env",
        "home_mounts": "'.aws' '.wandb'",
        "job_env": "'HF_HOME=/srv/models'",
        "spark_run": "/usr/local/bin/spark-run",
        "launcher": "/usr/local/bin/spark-container",
        "job_prefix": "spark-job-",
        "users": "'alice'",
        "secrets": "'/etc/sparkrig/ngc/secrets.env'",
        "drain": "/var/lib/sparkrig/drain",
    },
    "source_builds/build-prefix.sh.j2": {
        **_BUILD,
        "archive": "prefix.tar",
        "install_dir": "/opt/sparkrig/builds/nccl/0123456789abcdef",
        "needs": [
            ("SPARKRIG_NEED_NCCL", "/opt/sparkrig/builds/nccl/current", "/opt/sparkrig/builds/nccl/current/stamp.json")
        ],
    },
    "source_builds/build.sh.j2": {
        **_BUILD,
        "build_requirements": ["setuptools>=64", "wheel", "ninja"],
        "index_url": "https://pypi.org/simple",
        "uv": "/opt/sparkrig/uv/bin/uv",
        "venv": "/opt/sparkrig/venv",
        "venv_python": "/opt/sparkrig/venv/bin/python",
    },
    "updates/python-versions.sh.j2": {
        "limit": 1048576,
        "user_read": 'sh -c "$READ" sparkrig-read "$dir/METADATA" 1048576',
        "field": "base64 -w0",
    },
}
# A user_read() call as the deploy splices it in (sparkrig.user_files).
_READ = 'sh -c "$SPARKRIG_READ" sparkrig-read "$f" 1048576'
SAMPLES.update(
    {
        "cluster/confirm-link.sh.j2": {
            "dir": "/var/lib/sparkrig/cluster-link",
            "unit": "sparkrig-cluster-rollback",
            "boot_files": ["/etc/systemd/system/b.service", "/etc/systemd/system/w/b.service"],
            "ports": [
                {"interface": "enp1s0f1np1", "address": "192.168.100.11/24", "mtu": 9000, "peers": ["192.168.100.12"]}
            ],
        },
        "cluster/drop-authorized.sh.j2": {"marker": "sparkrig-cluster"},
        "cluster/put-authorized.sh.j2": {"marker": "sparkrig-cluster"},
        "cluster/read-authorized.sh.j2": {"marker": "sparkrig-cluster", "limit": 1048576, "user_read": _READ},
        "python_stack/stack.sh.j2": {
            "uv": "/opt/sparkrig/uv/bin/uv",
            "link": "/usr/local/bin/uv",
            "cache": "/var/cache/sparkrig/uv",
            "offline": "/var/lib/sparkrig/python-wheels",
            "read_cfg": _READ,
            "read_lock": _READ,
            "dists": "'true'",
            "reader": "'true'",
            "url_limit": 65536,
            "list_timeout": 30,
        },
        "metrics/sparkrig-metrics.sh.j2": {
            "name": "sparkrig.prom",
            "path": "/usr/local/sbin:/usr/bin",
            "textfile_dir": "/var/lib/sparkrig/metrics",
            "timeout_s": 5,
            "throttle_field": "clocks_throttle_reasons.active",
            "watchdog_service": "earlyoom.service",
            "unit_prefix": "spark-job-",
            "records": "/var/lib/sparkrig/jobs",
            "reboot_file": "/run/reboot-required",
            "compliance_file": "/var/lib/sparkrig/compliance-last",
            "proc": "/proc",
            "venv": "/opt/sparkrig/venv",
            "boot_count": 5,
            "user_read_root": _READ,
            "user_read_owner": 'runuser -u "$OWNER" -- ' + _READ,
        },
        "source_builds/build-result.sh.j2": {"result": _READ.replace('"$f"', '"$d/work/result"'), "tail_lines": 40},
        "source_builds/build-wait.sh.j2": {
            "result": _READ.replace('"$f"', '"$d/work/result"'),
            "tail_lines": 40,
            "progress_every_s": 60,
        },
    }
)
OWN_SCRIPTS = ("try", "test", ".ci/install", "lab/nvidia-smi-standin.sh")


def scripts() -> list[str]:
    """Every host-side script under templates/, relative to it."""
    return sorted(str(p.relative_to(TEMPLATES)) for p in TEMPLATES.rglob("*") if p.name.endswith((".sh", ".sh.j2")))


def _shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found:
        return found
    unavailable("shellcheck is not installed (apt-get install shellcheck; .ci/install does)")


def test_every_script_names_its_shell():
    for name in scripts():
        first = (TEMPLATES / name).read_text().splitlines()[0]
        assert first.startswith("#!") or first == "# shellcheck shell=sh", name


def test_every_template_script_has_a_sample_or_is_included():
    templated = {s for s in scripts() if s.endswith(".j2")}
    assert templated - set(INCLUDED) == set(SAMPLES), "give each .sh.j2 a sample in SAMPLES"


@pytest.mark.parametrize("name", scripts() + list(OWN_SCRIPTS))
def test_shellcheck(name, tmp_path):
    checker = _shellcheck()
    if name in INCLUDED:
        pytest.skip(f"{name} is only included, and checked, in {INCLUDED[name]}")
    if name in OWN_SCRIPTS:
        path = REPO / name
    elif name.endswith(".j2"):
        path = tmp_path / Path(name).stem
        path.write_text(rendering.render(name, **SAMPLES[name]))
    else:
        path = TEMPLATES / name
    result = subprocess.run([checker, *FLAGS, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, f"{name}:\n{result.stdout}"


_SHELL_WORDS = re.compile(r"\b(then|fi|done|esac|while|do)\b")


def test_no_host_script_lives_in_a_python_string():
    """A string of several lines that holds shell control flow is a script: it belongs in
    templates/ (loaded with sparkrig.rendering.script), where the gate above checks it."""
    found = []
    for folder in ("operations", "sparkrig"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                and node.body
                and isinstance(node.body[0], ast.Expr)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    text = node.value
                elif isinstance(node, ast.JoinedStr):
                    text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
                else:
                    continue
                if text.count("\n") >= 2 and len(_SHELL_WORDS.findall(text)) >= 2:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []
