"""
Python stack controls: uv pinned, the venv holding exactly the manifest's pins, and on a GPU
host a CUDA 13 PyTorch that really computes on the device.

The expected values are worked out here from the settings and the manifest, independently
of the code that converges (operations/python_stack/): nothing of it is imported.
The GPU controls skip on a host without an NVIDIA GPU, saying so; on the lent H100 they
run with testinfra's local backend (README, "Python stack").
"""

from __future__ import annotations

import re
import shlex
import urllib.parse

import pytest

from sparkrig.tools.report import printable

from .reads import need, system_login
from .venv import distributions, interpreter, pyvenv_version

UV = "/opt/sparkrig/uv/bin/uv"
UV_TOOL = "/opt/sparkrig/uv"
OFFLINE_WHEELS = "/var/lib/sparkrig/python-wheels"  # python_offline's wheels on the host


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture
def manifest(settings) -> dict:
    return settings["python_stack"]


@pytest.fixture
def venv(settings) -> str:
    return settings["python_venv_path"]


@pytest.fixture
def pins(manifest, settings) -> dict[str, str]:
    """Every package the manifest pins for this host, by normalised name."""
    found = {}
    if manifest.get("torch"):
        found.update(manifest["torch"]["packages"])
    if manifest.get("vllm"):
        found[manifest["vllm"]["name"]] = manifest["vllm"]["version"]
    found.update(manifest.get("packages") or {})
    for profile in settings["python_stack_profiles"]:
        found.update(manifest["profiles"][profile])
    return {_normal(name): version for name, version in found.items()}


def _installed(found: dict) -> dict[str, str]:
    """Installed distributions by normalised name: their versions (from their dist-info folders)."""
    return {_normal(name): d["version"] for name, d in found.items()}


def _same_version(installed: str, pinned: str) -> bool:
    """PEP 440 '==': a pin without a local label matches any local label (2.11.0+cu130)."""
    return installed == pinned or ("+" not in pinned and installed.split("+")[0] == pinned)


@need
def tooling(r) -> dict:
    """uv's version and the readings of its tool environment, the venv and its pyvenv.cfg."""
    venv = r.settings["python_venv_path"]
    return {
        "uv": r.run(f"{UV} --version"),
        "paths": {path: r.path(path) for path in (UV_TOOL, f"{UV_TOOL}/bin", UV, f"{venv}/pyvenv.cfg", venv)},
        "python": pyvenv_version(r, venv),
    }


@need
def installed(r) -> dict[str, str]:
    """The venv's distributions and their versions, from their dist-info folders' names (as the deploy reads them)."""
    return _installed(distributions(r, r.settings["python_venv_path"]))


LOCK_LIMIT = 16 << 20  # the venv's lock (about 0.4 MB for the default stack)


@need
def uv_checks(r) -> dict:
    """The lock the deploy put in the venv (as a file: its owner may replace it), and
    UV_NO_SYNC as a login shell of the owner gets it from the system's profile. Nothing of
    the owner's runs: neither their python (which uv's dry run starts) nor their own
    start-up files."""
    lock = f"{r.settings['python_venv_path']}/sparkrig/requirements.lock"
    return {
        "lock": r.user_file(shlex.quote(lock), LOCK_LIMIT),
        "no_sync": r.run(system_login("echo UV_NO_SYNC=$UV_NO_SYNC", r.settings["python_venv_owner"]), sudo=True),
    }


def test_uv_is_the_pinned_release(read, settings):
    """Protects against a drifting installer: another uv resolves the same manifest
    differently, and a uv fetched by `curl | sh` was never checked against a hash."""
    assert read(tooling)["uv"].check().split()[1] == settings["python_uv_version"]


def test_uv_tool_environment_is_root_owned_and_not_writable_by_others(read):
    """Protects against privilege escalation: every deploy runs this uv, partly as root."""
    for path in (UV_TOOL, f"{UV_TOOL}/bin", UV):
        f = read(tooling)["paths"][path]
        assert f.user == "root" and f.mode & 0o022 == 0, f"{path}: {f.user} {f.mode:o}"


def test_venv_has_the_configured_owner_and_python(read, settings, manifest, venv):
    """Protects against a venv the user cannot maintain (wrong owner) or wheels built for
    another interpreter (cp312 wheels in a 3.11 venv fail at import)."""
    found = read(tooling)
    assert found["paths"][f"{venv}/pyvenv.cfg"].is_file, f"{venv} is no virtualenv"
    assert found["paths"][venv].user == settings["python_venv_owner"]
    assert found["python"]() == manifest["python"]


def test_every_pinned_package_is_at_its_pinned_version(read, pins):
    """Protects against the day lost to a silently replaced torch: each pinned package
    (torch, torchvision, torchaudio, vLLM, extras, profiles) is at the manifest's version."""
    versions = read(installed)
    wrong = {
        name: (versions.get(name), pinned)
        for name, pinned in pins.items()
        if name not in versions or not _same_version(versions[name], pinned)
    }
    assert not wrong, f"installed vs pinned: {wrong}"


def test_vllm_came_from_the_pinned_wheel(read, profile, manifest, settings):
    """Protects against a vLLM built against another torch: the wheel installed is the one
    the manifest names, by URL (its sha256 was checked at install), or with python_offline
    that file as the controller uploaded it."""
    vllm = manifest.get("vllm")
    if not vllm or not vllm.get("wheels"):
        pytest.skip("the manifest pins no vLLM wheel URL for this host")
    url = vllm["wheels"][profile["arch"]]["url"]
    if settings["python_offline"]:
        url = f"file://{OFFLINE_WHEELS}/{urllib.parse.unquote(url.rsplit('/', 1)[1])}"
    found = read(venv_distributions).get(_normal(vllm["name"]))
    assert found and found["direct"], f"{vllm['name']} is not installed from a URL"
    assert found["direct"]["url"] == url


def test_flash_attn_is_not_installed(read):
    """Protects against a broken attention path: flash-attn has no sm_121 kernels and is
    CUDA 12 only; PyTorch's SDPA is the supported path on a Spark."""
    assert "flash-attn" not in read(installed)


def _locked(text: str) -> dict[str, tuple[str | None, str | None]]:
    """What a lock installs: {normalised name: (version, URL or None)} (a URL's version from
    its wheel file's name)."""
    wanted = {}
    for line in text.splitlines():
        if not line or line[0].isspace() or line.startswith("#"):
            continue
        first = line.rstrip("\\").split(";")[0].strip()
        if " @ " in first:
            name, rest = first.split(" @ ", 1)
            name, url = name.strip(), rest.split()[0]  # a built wheel's line holds its --hash too
            fields = urllib.parse.unquote(url.rsplit("/", 1)[-1]).split("-")
            wanted[_normal(name)] = (fields[1] if len(fields) >= 5 else None, url)
        else:
            name, _, version = first.partition("==")
            wanted[_normal(name)] = (version.strip() or None, None)
    return wanted


def _unquoted(url: str | None) -> str:
    return urllib.parse.unquote(url or "")


def test_venv_holds_exactly_its_lock(read):
    """Protects against drift (a hand-installed, removed or upgraded package): the venv's
    records (its .dist-info directories, read as files) name exactly the lock the deploy
    made, each at its locked version, one locked by URL installed from that URL (NVIDIA's
    aarch64 cuSPARSELt wheel, whose WHEEL file names another platform, is no drift: uv's dry
    run, which said so, ran the owner's python and is no longer asked)."""
    wanted = _locked(read(uv_checks)["lock"].check())
    have = read(venv_distributions)
    problems = [f"{name} is not locked" for name in sorted(set(have) - set(wanted))]
    for name, (version, url) in sorted(wanted.items()):
        found = have.get(name)
        if not found:
            problems.append(f"{name} is missing")
        elif version is not None and found["version"] != version:
            problems.append(f"{name} {found['version']}, locked {version}")
        elif url is not None and _unquoted((found["direct"] or {}).get("url")) != _unquoted(url):
            problems.append(f"{name} not from {url}")
    assert not problems, "; ".join(problems[:20])


def test_uv_run_never_resyncs_for_the_owner(read):
    """Protects against `uv run` silently replacing hand-built packages by re-syncing a
    project (seeds 001 to 003): UV_NO_SYNC=1 in the owner's login shell, as the system's
    profile sets it (the owner's own start-up files are theirs, and are not run here)."""
    value = (read(uv_checks)["no_sync"].check().splitlines() or [""])[-1]
    assert value == "UV_NO_SYNC=1", (
        f"a login shell of the venv's owner has {value or 'nothing'}, not UV_NO_SYNC=1, from the system's "
        "profile (/etc/profile.d/sparkrig-cuda.sh, written by the cuda_env concern)"
    )


@pytest.mark.action
def test_uv_run_in_a_project_uses_the_managed_venv_as_it_is(host, read, settings, venv):
    """Protects against `uv run` in a project syncing an environment of its own and missing
    the managed stack (CUDA 13 builds replaced by PyPI's, or a second venv): `uv run` in a
    user's project (a scratch one here, made by the venv's owner) runs the managed venv's
    Python, makes no `.venv` and no lock, and leaves the venv exactly as its lock says."""
    owner = shlex.quote(settings["python_venv_owner"])
    script = (
        'd=$(mktemp -d) && cd "$d" && { echo "[project]"; echo "name = \\"scratch\\""; '
        'echo "version = \\"0\\""; echo "dependencies = [\\"six\\"]"; } > pyproject.toml && '
        'uv run python -c "import sys; print(sys.prefix)" && ls -A; rm -rf "$d"'
    )
    with host.sudo():
        ran = host.run(f"runuser -l {owner} -c {shlex.quote(script)}")
    out = ran.stdout.splitlines()
    said = (ran.stderr.strip().splitlines() or ["nothing on stderr"])[-1]
    assert out[-2:] == [venv, "pyproject.toml"], (
        f"uv run in a scratch project of {settings['python_venv_owner']}'s (exit {ran.rc}) printed {out[-2:]}, not "
        f"[{venv!r}, 'pyproject.toml'] (its Python's prefix, then the project's files): {printable(said)}"
    )
    test_venv_holds_exactly_its_lock(read)


@need
def venv_distributions(r) -> dict[str, dict]:
    """The venv's distributions by normalised name: version and direct_url.json (as files)."""
    return {_normal(name): d for name, d in distributions(r, r.settings["python_venv_path"]).items()}


def _interpreter_answer(r, code: str, gpu: bool = False):
    """What the venv's own interpreter prints for ``code``, run as the venv's owner
    (venv.interpreter's rule); the GPU's questions only where there is one (the gpu
    fixture's rule). Each is asked by an action control alone, when it runs: an import of
    torch takes seconds (more on a Spark, vLLM's tens), which the read-only run never waits
    for; the pins' versions are read from the venv's records instead (test_every_pin...)."""
    if not r.settings["python_stack"].get("torch"):
        return None
    venv, owner = r.settings["python_venv_path"], r.settings["python_venv_owner"]
    return r.run(
        ("test -e /dev/nvidiactl && " if gpu else "") + interpreter(r.settings, code),
        sudo=True,
        shown=f"{venv}/bin/python, run as its owner {owner} (nobody where that is root), asked {code!r}",
    )


@need(prefetch=False)
def torch_import(r):
    return _interpreter_answer(r, "import torch; print(torch.__version__)")


@need(prefetch=False)
def torch_cuda(r):
    return _interpreter_answer(r, "import torch; print(torch.version.cuda)", gpu=True)


@need(prefetch=False)
def torch_capability(r):
    return _interpreter_answer(
        r,
        "import torch\n"
        "assert torch.cuda.is_available(), 'torch.cuda.is_available() is False'\n"
        "print('%d.%d' % torch.cuda.get_device_capability(0))",
        gpu=True,
    )


@need(prefetch=False)
def vllm_import(r):
    return _interpreter_answer(r, "import vllm; print(vllm.__version__)", gpu=True)


@pytest.fixture
def torch_pin(pins) -> str:
    if "torch" not in pins:
        pytest.skip(
            "this host's manifest pins no torch (in the lab: the machine's wheel folder "
            "holds no torch wheel for this host's Python)"
        )
    return pins["torch"]


@pytest.mark.action
def test_torch_imports_at_its_pinned_version(read, torch_pin):
    """Protects against a venv that installs but cannot import torch (a missing shared
    library, a wheel for another platform)."""
    assert _same_version(read(torch_import).check(), torch_pin)


# GPU controls -----------------------------------------------------------------------


@need
def gpu_device(r):
    """/dev/nvidiactl, there where the host has an NVIDIA GPU."""
    return r.path("/dev/nvidiactl")


@pytest.fixture
def gpu(read, torch_pin) -> None:
    if not read(gpu_device).exists:
        pytest.skip("no NVIDIA GPU on this host (/dev/nvidiactl is missing): GPU controls need one")


@pytest.mark.action
def test_gpu_torch_is_a_cuda_13_build(read, gpu):
    """Protects against PyPI's CPU-only aarch64 torch, or a cu12x / cu132 build picked by
    uv's `auto` backend: the Spark's stack is CUDA 13.0."""
    assert read(torch_cuda).check().startswith("13.")


@pytest.mark.action
def test_gpu_is_available_with_the_profiles_capability(read, profile, gpu):
    """Protects against a box deployed with another box's profile (sm_121 kernels on an
    sm_120 card): torch sees the GPU, of the compute capability the profile names."""
    assert read(torch_capability).check() == profile["compute_capability"]


GPU_WORK = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
c = a @ b
ref = a.float() @ b.float()
err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
assert c.dtype == torch.bfloat16 and c.is_cuda and err < 2e-2, err
q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
mask = torch.ones(256, 256, device="cuda", dtype=torch.bool).tril()
w = (q.float() @ k.float().transpose(-2, -1) / 8.0).masked_fill(~mask, float("-inf")).softmax(-1)
sdpa_err = (out.float() - w @ v.float()).abs().max().item()
torch.cuda.synchronize()
assert out.shape == q.shape and out.is_cuda and sdpa_err < 5e-2, sdpa_err
print(f"matmul_rel_err={err:.2e} sdpa_max_err={sdpa_err:.2e} device={torch.cuda.get_device_name(0)}")
"""


@pytest.mark.action
def test_gpu_bf16_matmul_and_sdpa_run_and_are_right(host, settings, gpu):
    """Protects against a stack that imports but cannot compute: kernels missing for this
    GPU ("no kernel image is available"), or wrong results, in the two operations every
    LLM workload needs: a bf16 matmul and scaled_dot_product_attention."""
    with host.sudo():
        assert "matmul_rel_err=" in host.check_output(interpreter(settings, GPU_WORK))


@pytest.mark.action
def test_gpu_vllm_imports(read, manifest, gpu):
    """Protects against a vLLM built for another torch or CUDA (undefined symbols at
    import): it imports, at the pinned version."""
    vllm = manifest.get("vllm")
    if not vllm or vllm["name"] != "vllm":
        pytest.skip("the manifest installs no vLLM on this host")
    version = read(vllm_import).check()
    assert _same_version(version, vllm["version"])
