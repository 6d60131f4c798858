"""
The real Python stack, installed for real in the lab (opt-in: ``uv run pytest -m real_stack``;
never in the default run, see tests/conftest.py). The real manifest, locked for Debian 12's
Python 3.11 (lab/realstack.py), converged by python_stack() through the pyinfra CLI, offline
(the controller downloads each wheel once, into a cache kept between runs), onto an x86_64
Debian 12 host and the emulated aarch64 Spark (flavour gb10), base then ``unsloth``. On
aarch64 xformers has no wheel: its lock leaves it to the catalogue's source build, here the
lab's named STAND-IN (compiling xformers under qemu-user takes hours); xformers' real sources
are built natively on the x86_64 host (CPU-only: no CUDA in the lab) for its time and memory.
The figures go to lab/realstack.FIGURES and docs/python-stack.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import lab
from lab import realstack
from lab.fleet import _read_state
from sparkrig import stack_locks as ps_locks
from sparkrig.python_wheels import offline_wheels
from sparkrig.tools import check
from tests.conftest import LAB_INVENTORY, lab_says
from tests.support import REPO, run_deploy

pytestmark = [pytest.mark.lab, pytest.mark.real_stack]
HOSTS = (("lab-deb12", "debian12"), ("lab-gb10", "gb10"))
ARCH = {"lab-deb12": "x86_64", "lab-gb10": "aarch64"}
VENV = "/opt/sparkrig/venv"
DEPLOY = "tests/converge/real_stack_deploy.py"
STANDIN_BUILD = {"lab-gb10": {"xformers": "standin"}}
FIGURES: dict = {}


@pytest.fixture(scope="module")
def real_lab(request):
    missing = lab.missing_requirements()
    if missing:
        pytest.skip("the lab cannot run on this machine: " + "; ".join(missing))
    if request.config.getoption("--reuse-lab"):
        running = {h["name"]: h for h in lab.status()}
        if not all(running.get(name, {}).get("ssh_ok") for name, _ in HOSTS):
            pytest.fail(f"--reuse-lab: {', '.join(n for n, _ in HOSTS)} are not up and reachable: {running}")
    else:
        lab_says(request.config, f"booting {', '.join(n for n, _ in HOSTS)} for the real stack")
        lab.up(hosts=list(HOSTS))
    started = time.monotonic()
    said = realstack.make_locks()
    lab_says(request.config, f"real stack locked for Python {realstack.PYTHON} in {time.monotonic() - started:.0f} s")

    realstack.serve_sources(_read_state().apt_repo.root, real=True)
    yield SimpleNamespace(said=said)
    if FIGURES:
        realstack.FIGURES.write_text(json.dumps(FIGURES, indent=1, sort_keys=True) + "\n")
        lab_says(request.config, f"figures in {realstack.FIGURES}")
    if not request.config.getoption("--keep-lab") and not request.config.getoption("--reuse-lab"):
        lab.down()


def _deploy(host: str, profiles: list[str], builds: dict | None = None):
    env = {realstack.ENV: json.dumps({"profiles": profiles, "builds": builds or {}})}
    started = time.monotonic()
    result = run_deploy(LAB_INVENTORY, "--limit", host, deploy=DEPLOY, env=env, timeout=7200)
    return result, time.monotonic() - started


def _lock(arch: str, profiles: list[str]) -> str:
    return (realstack.LOCKS / ps_locks.lock_name(realstack.manifest(), profiles, arch)).read_text()


def _wheels(arch: str, profiles: list[str]) -> dict[str, str]:
    return offline_wheels(_lock(arch, profiles), arch, realstack.PYTHON, realstack.WHEELS)


def _size(paths) -> int:
    return sum(Path(p).stat().st_size for p in paths)


# When the host's last upload of wheels ended and its last install into the venv (xformers,
# which a source build installs after it, aside) ended: the install ran between the later of
# that upload and the deploy's start (the lab's hosts share the controller's clock) and then.
_TIMES = (
    "W=/var/lib/sparkrig/python-wheels; V=/opt/sparkrig/venv;"
    " echo $(find $W -name '*.whl' -printf '%T@\\n' | sort -n | tail -n 1)"
    " $(find $V -path '*.dist-info/INSTALLER' -not -path '*/xformers-*' -printf '%T@\\n' | sort -n | tail -n 1)"
)


def _install_s(host: str, started: float) -> int | None:
    uploaded, installed = map(float, lab.run_ssh(host, f"sudo sh -c {shlex.quote(_TIMES)}", timeout=600).stdout.split())
    return round(installed - max(uploaded, started)) if installed > started else None


@pytest.fixture(scope="module")
def converged(real_lab, request):
    """Base, then unsloth, on each host in turn (timed one by one): the aarch64 host with the
    xformers STAND-IN build its unsloth lock needs."""
    results = {}
    for profiles in ([], ["unsloth"]):
        for host, _flavour in HOSTS:
            started = time.time()
            result, seconds = _deploy(host, profiles, STANDIN_BUILD if profiles else None)
            lab_says(request.config, f"{host} {profiles or 'base'}: exit {result.returncode} in {seconds:.0f} s")
            results[(host, tuple(profiles))] = result
            FIGURES.setdefault("converge_s", {})[f"{host} {'+'.join(profiles) or 'base'}"] = round(seconds)
            assert result.returncode == 0, result.log[-4000:]
            FIGURES.setdefault("install_s", {})[f"{host} {'+'.join(profiles) or 'base'}"] = _install_s(host, started)
    for arch in ("x86_64", "aarch64"):
        for profiles in ([], ["unsloth"]):
            FIGURES.setdefault("download_bytes", {})[ps_locks.lock_name(realstack.manifest(), profiles, arch)] = _size(
                _wheels(arch, profiles).values()
            )
    both = {**_wheels("x86_64", ["unsloth"]), **_wheels("aarch64", ["unsloth"])}
    FIGURES["offline"] = {
        "each_host_downloading_bytes": _size(_wheels("x86_64", ["unsloth"]).values())
        + _size(_wheels("aarch64", ["unsloth"]).values()),
        "controller_downloads_bytes": _size(both.values()),
    }
    return results


def _python(host: str, code: str, timeout: int = 1800) -> str:
    result = lab.run_ssh(host, f"sudo {VENV}/bin/python -I -c {shlex.quote(code)}", timeout=timeout)
    return result.stdout


@pytest.mark.parametrize("host", [name for name, _ in HOSTS])
def test_the_real_stack_imports_as_a_cuda_13_build(converged, host):
    """torch is PyPI's CUDA 13.0 build; vLLM, transformers, trl, bitsandbytes and xformers
    import (on aarch64 the source-built STAND-IN); vLLM's extension needs nothing but the
    driver's libcuda; every installed package's requirements are met."""
    found = json.loads(
        _python(
            host,
            (
                "import json, importlib, importlib.util, torch, xformers\n"
                "found = {'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
                "         'xformers': xformers.__version__, 'standin': getattr(xformers, 'STANDIN', False)}\n"
                "for name in ('vllm', 'transformers', 'trl', 'bitsandbytes'):\n"
                "    found[name] = importlib.import_module(name).__version__\n"
                "found['vllm_c'] = importlib.util.find_spec('vllm._C').origin\n"
                "print(json.dumps(found))\n"
            ),
        ).splitlines()[-1]
    )
    assert found["cuda"] == "13.0" and found["torch"].startswith("2.11.0"), found
    assert found["vllm"].startswith("0.20.2"), found
    if ARCH[host] == "aarch64":
        assert found["standin"] and found["xformers"] == realstack.STANDIN_VERSION, found
    else:
        assert not found["standin"] and found["xformers"] == "0.0.35", found
    # The libraries torch loads before vLLM's extension: the venv's torch/lib and nvidia/*/lib.
    site = found["vllm_c"].rsplit("/vllm/", 1)[0]
    ldd = lab.run_ssh(
        host,
        f"LD_LIBRARY_PATH=$(ls -d {site}/torch/lib {site}/nvidia/*/lib | tr '\\n' :)"
        f" ldd {shlex.quote(found['vllm_c'])}",
        timeout=600,
    ).stdout
    missing = [line.split()[0] for line in ldd.splitlines() if "not found" in line]
    assert missing == ["libcuda.so.1"], ldd
    check = lab.run_ssh(host, f"sudo /usr/local/bin/uv pip check --python {VENV}/bin/python", check=False, timeout=600)
    found_issues = [line for line in (check.stdout + check.stderr).splitlines() if line.startswith("The package ")]
    # NVIDIA's aarch64 cuSPARSELt wheel (nvidia_cusparselt_cu13-0.8.0-py3-none-manylinux2014_aarch64.whl,
    # torch's requirement on every aarch64 host, a Spark's too) declares `Tag: py3-none-manylinux2014_sbsa`
    # in its WHEEL file, a tag no host matches: uv pip check reports it; uv installs by the file's name.
    vendor = (
        ["The package `nvidia-cusparselt-cu13` was built for a different platform"] if ARCH[host] == "aarch64" else []
    )
    assert found_issues == vendor and check.returncode == (1 if vendor else 0), check.stdout + check.stderr
    FIGURES.setdefault("hosts", {})[host] = {
        **found,
        "venv_bytes": int(lab.run_ssh(host, f"sudo du -sb {VENV}").stdout.split()[0]),
    }


def test_a_second_converge_changes_nothing(converged, request):
    for host, _flavour in HOSTS:
        result, seconds = _deploy(host, ["unsloth"], STANDIN_BUILD)
        assert result.returncode == 0, result.log[-4000:]
        assert result.changed() == {}, (result.changed(), result.log[-3000:])
        FIGURES.setdefault("converge_s", {})[f"{host} unsloth, converged"] = round(seconds)
        lab_says(request.config, f"{host}: no change in {seconds:.0f} s")


def test_the_python_stack_controls_pass_on_the_real_stack(converged):
    """The compliance suite's Python stack controls, run as a user runs them, on both hosts
    (the GPU controls skip: no GPU in the lab)."""
    env = {**os.environ, realstack.ENV: json.dumps({"profiles": ["unsloth"], "builds": STANDIN_BUILD})}
    result = subprocess.run(
        check.command(
            LAB_INVENTORY, [",".join(name for name, _ in HOSTS)], extra=["-q", "-rfs", "-k", "test_python_stack"]
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    for host, _flavour in HOSTS:
        assert re.search(rf"^{host} +(\d+) +0 +\d+$", result.stdout, re.MULTILINE), result.stdout[-3000:]


def test_xformers_real_sources_build_natively_through_the_source_build_path(converged, request):
    """xformers v0.0.33's own sources built on the x86_64 host by the catalogue's entry (CPU
    parts only: no CUDA here), its wheel installed over PyPI's: time and peak memory."""
    host = "lab-deb12"
    peak = {"bytes": 0}
    done = threading.Event()

    # The lab's containers have no memory controller (no memory.peak): the build unit's
    # processes' resident memory, summed every 10 s, is its peak's estimate.
    rss = (
        "c=$(ls -d /sys/fs/cgroup/training.slice/sparkrig-build-xformers-*.service 2>/dev/null | head -n 1);"
        ' [ -n "$c" ] && for p in $(cat "$c/cgroup.procs"); do awk \'/VmRSS/{print $2}\' /proc/$p/status'
        " 2>/dev/null; done | awk '{s += $1} END {print s * 1024}'"
    )

    def watch():
        while not done.wait(10):
            out = lab.run_ssh(host, rss, check=False, timeout=60).stdout.split()
            peak["bytes"] = max([peak["bytes"], *[int(v) for v in out if v.isdigit()]])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.time()
    try:
        result, seconds = _deploy(host, ["unsloth"], {host: {"xformers": "real"}})
    finally:
        done.set()
        watcher.join()
    journal = lab.run_ssh(
        host, "sudo journalctl -u 'sparkrig-build-xformers-*' -o short-unix --no-pager", check=False, timeout=120
    ).stdout
    # This deploy's build alone (a lab kept from an earlier run has that build shared already).
    stamps = [float(line.split()[0]) for line in journal.splitlines() if line[:1].isdigit()]
    stamps = [stamp for stamp in stamps if stamp >= started]
    FIGURES["xformers_build"] = {
        "deploy_s": round(seconds),
        "build_s": round(stamps[-1] - stamps[0]) if stamps else None,
        "memory_peak_rss_bytes": peak["bytes"],
        "journal_tail": journal.splitlines()[-5:],
    }
    lab_says(request.config, f"xformers built in {FIGURES['xformers_build']['build_s']} s, peak {peak['bytes']} bytes")
    assert result.returncode == 0, result.log[-4000:]
    found = json.loads(_python(host, "import json, xformers; print(json.dumps(xformers.__version__))").splitlines()[-1])
    assert found.startswith("0.0.33"), found
