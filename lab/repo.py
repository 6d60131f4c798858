"""The lab's own signed apt repositories, stand-ins for Docker's and NVIDIA's.

The lab hosts cannot reach download.docker.com nor nvidia.github.io, so the
controller serves two repositories laid out like those, each signed with a
key of its own (so that a per-repository ``signed-by`` is really tested),
holding clearly named stand-in packages:

- ``docker/linux/debian``, like ``https://download.docker.com/linux/debian``:
  ``gpg`` (the armored key), ``dists/<suite>/{Release,InRelease,Release.gpg}``
  and ``dists/<suite>/stable/binary-amd64/Packages{,.gz}`` for each lab suite,
  the package in ``pool/stable/``;
- ``nvidia/libnvidia-container``, like ``https://nvidia.github.io/libnvidia-container``:
  ``gpgkey``, and the flat repositories ``stable/deb/<arch>/`` (apt source
  ``Suites: /``) with their indexes and the package side by side;
- ``dgx/baseos``, a flat repository standing in for the NVIDIA-configured
  sources DGX OS installs its stack from (``gpgkey`` beside it), holding both
  stand-in packages: the ``dgx_os`` flavours' hosts are given it, pinned, and
  install Docker and the toolkit from it before any deploy (lab/dgxos.py); it also
  holds kernel-like and driver-like stand-ins in two versions each
  (``sparkrig-lab-standin-kernel``, ``sparkrig-lab-standin-nvidia-driver``), which
  the updates tests hold, pin and upgrade.

Every index covers each architecture of the lab's flavours (amd64, and arm64
for the emulated ``gb10``); the packages themselves are ``Architecture: all``.

The same site serves the lab's Python wheelhouse under ``wheels/``
(lab/wheelhouse.py) and the git repository of its source-build project
under ``sources/`` (lab/sourcebuild.py).

Everything lives under ``CACHE_DIR/repo``: ``gnupg/`` holds the two signing
keys (made once, kept across ``up``/``down``), ``site-<key>/`` is the served
tree, where the key hashes the recipe (the packages, the suites,
:data:`RECIPE_VERSION`) and the keys' fingerprints, so the tree is rebuilt
only when one of them changes. A build runs in ``tmp/`` and is renamed into
place when complete. The packages are built with ``dpkg-deb``, the indexes
written here, the Release files signed with ``gpg``.

:func:`start_server` and :func:`stop_server` run ``reposerver.py``, which
serves the tree over HTTP on the hosts' gateway addresses.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import sourcebuild, wheelhouse
from .config import (
    DOCKER_STANDIN_PACKAGE,
    DRIVER_STANDIN_PACKAGE,
    KERNEL_STANDIN_PACKAGE,
    LOCAL_WHEEL_DIR,
    STOP_GRACE_S,
    TOOLKIT_STANDIN_PACKAGE,
    UPDATE_STANDIN_VERSIONS,
)
from .model import FLAVOURS, REPO_SERVER_SCRIPT, AptRepo
from .render import (
    parse_gpg_fingerprints,
    release_date,
    render_deb822,
    render_packages,
    render_packages_entry,
    render_release,
)
from .reposerver import READY
from .system import (
    LabError,
    lab_repo_server_pids,
    pid_alive,
    run,
    spawn,
    stop_processes,
    tail,
    write_file,
)

log = logging.getLogger("sparkrig.lab")

RECIPE_VERSION = 1

MAINTAINER = "sparkrig lab <sparkrig-lab@localhost.invalid>"

# The signing keys, by the repository they sign.
KEY_UIDS: dict[str, str] = {
    "docker": "sparkrig lab docker repository key (stand-in)",
    "nvidia": "sparkrig lab nvidia repository key (stand-in)",
    "dgx": "sparkrig lab DGX OS repository key (stand-in)",
}

DOCKER_ROOT = "docker/linux/debian"
DOCKER_COMPONENT = "stable"
NVIDIA_ROOT = "nvidia/libnvidia-container"
DGX_ROOT = "dgx"
DGX_FLAT = f"{DGX_ROOT}/baseos"
DGX_ORIGIN = "sparkrig lab (stand-in for DGX OS)"

# Where each repository's armored public key is served, below the site.
PUBLIC_KEYS: dict[str, str] = {
    "docker": f"{DOCKER_ROOT}/gpg",
    "nvidia": f"{NVIDIA_ROOT}/gpgkey",
    "dgx": f"{DGX_ROOT}/gpgkey",
}


def architectures() -> list[str]:
    """The Debian architectures of the lab's flavours."""
    return sorted({flavour.arch for flavour in FLAVOURS.values()})


def nvidia_flat(arch: str) -> str:
    """The NVIDIA-like flat repository of one architecture, below the site."""
    return f"{NVIDIA_ROOT}/stable/deb/{arch}"


SERVER_START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class PackageFile:
    """A file a stand-in package installs (``path`` absolute on the host)."""

    path: str
    content: str
    mode: int = 0o644


@dataclass(frozen=True)
class StandinPackage:
    """A small ``Architecture: all`` package standing in for a real one."""

    name: str
    version: str
    depends: str
    summary: str
    description: str
    files: tuple[PackageFile, ...]

    @property
    def deb_name(self) -> str:
        """The .deb's file name, as Debian names it."""
        return f"{self.name}_{self.version}_all.deb"


def _readme(name: str, real: str, what: str) -> PackageFile:
    return PackageFile(
        f"/usr/share/doc/{name}/README",
        f"{name}: a stand-in made by the sparkrig test lab (lab/repo.py).\n\n"
        f"It is NOT {real}. The lab hosts cannot reach the real repository, so the\n"
        f"lab serves this package from a repository laid out like the real one.\n"
        f"{what}\n",
    )


DOCKER_STANDIN = StandinPackage(
    name=DOCKER_STANDIN_PACKAGE,
    version="1.0",
    # Debian 13's docker.io (26) leaves the client to docker-cli; Debian 12's (20.10) holds it.
    depends="docker.io, docker-cli | docker.io (<< 26~)",
    summary="sparkrig lab stand-in for Docker's docker-ce (installs Debian's docker.io)",
    description=(
        "A package of the sparkrig test lab, served from the lab's copy of Docker's\n"
        "apt repository layout. It holds only this notice; its dependencies bring\n"
        "Debian's own docker.io (and docker-cli where Debian ships the client apart)."
    ),
    files=(
        _readme(
            DOCKER_STANDIN_PACKAGE,
            "Docker's docker-ce",
            "It holds only this file and depends on Debian's docker.io and docker client.",
        ),
    ),
)

TOOLKIT_STANDIN = StandinPackage(
    name=TOOLKIT_STANDIN_PACKAGE,
    version="1.0",
    depends="runc",
    summary=(
        "sparkrig lab stand-in for NVIDIA's nvidia-container-toolkit "
        "(a runc pass-through named nvidia-container-runtime)"
    ),
    description=(
        "A package of the sparkrig test lab, served from the lab's copy of NVIDIA's\n"
        "flat apt repository layout. Its /usr/bin/nvidia-container-runtime execs runc,\n"
        "as the real runtime does for containers that request no GPU."
    ),
    files=(
        PackageFile(
            "/usr/bin/nvidia-container-runtime",
            "#!/bin/sh\n"
            f"# sparkrig lab stand-in for NVIDIA's nvidia-container-runtime (package\n"
            f"# {TOOLKIT_STANDIN_PACKAGE}). The real runtime is a runc shim\n"
            "# that passes containers requesting no GPU through to runc; this one always does.\n"
            'exec runc "$@"\n',
            0o755,
        ),
        _readme(
            TOOLKIT_STANDIN_PACKAGE,
            "NVIDIA's nvidia-container-toolkit",
            "Its /usr/bin/nvidia-container-runtime only runs runc with the same arguments.",
        ),
    ),
)

STANDINS: tuple[StandinPackage, ...] = (DOCKER_STANDIN, TOOLKIT_STANDIN)


def _update_standin(name: str, version: str, real: str) -> StandinPackage:
    return StandinPackage(
        name=name,
        version=version,
        depends="base-files",
        summary=f"sparkrig lab stand-in for {real} (version {version}; installs nothing that runs)",
        description=(
            "A package of the sparkrig test lab, served in two versions from the lab's DGX OS\n"
            "stand-in repository, so that holds, pins and upgrades (operations/updates/)\n"
            "are tested on a package whose new version apt really offers."
        ),
        files=(_readme(name, real, f"Version {version}: it holds only this file."),),
    )


# Kernel-like and driver-like packages in two versions each (lab hosts share the
# controller's kernel and have no GPU): what updates_hold holds back in the lab.
UPDATE_STANDINS: tuple[StandinPackage, ...] = tuple(
    _update_standin(name, version, real)
    for name, real in (
        (KERNEL_STANDIN_PACKAGE, "a kernel package (linux-image-*)"),
        (DRIVER_STANDIN_PACKAGE, "an NVIDIA driver package (nvidia-driver-*)"),
    )
    for version in UPDATE_STANDIN_VERSIONS
)


def suites() -> list[str]:
    """The Debian suites of the Docker-like repository: those of the lab's flavours."""
    return sorted({flavour.suite for flavour in FLAVOURS.values()})


def docker_pool_path(package: StandinPackage) -> str:
    """A package's place in the Docker-like repository, relative to its root."""
    return f"pool/{DOCKER_COMPONENT}/{package.deb_name}"


def installed_size(package: StandinPackage) -> int:
    """Installed-Size in KiB: each file rounded up to whole KiB, as dpkg-gencontrol counts."""
    return sum(max(1, math.ceil(len(file.content.encode()) / 1024)) for file in package.files)


def control_fields(package: StandinPackage) -> dict[str, str]:
    """The package's DEBIAN/control fields, in Debian's order."""
    return {
        "Package": package.name,
        "Version": package.version,
        "Architecture": "all",
        "Maintainer": MAINTAINER,
        "Installed-Size": str(installed_size(package)),
        "Depends": package.depends,
        "Section": "admin",
        "Priority": "optional",
        "Description": f"{package.summary}\n{package.description}",
    }


def site_files(
    debs: Mapping[str, bytes], date: str, update_debs: Mapping[str, bytes] | None = None
) -> dict[str, bytes]:
    """Every file of the site except keys and signatures, by path below the site.

    ``debs`` maps package names (of :data:`STANDINS`) to their built .deb,
    ``update_debs`` the .deb file names of :data:`UPDATE_STANDINS` (both versions of
    each, in the DGX OS stand-in repository) to theirs.
    The files to sign are the ``Release`` ones (:func:`release_files`).
    """
    files: dict[str, bytes] = {}
    docker_entry = render_packages_entry(
        control_fields(DOCKER_STANDIN), docker_pool_path(DOCKER_STANDIN), debs[DOCKER_STANDIN.name]
    )
    files[f"{DOCKER_ROOT}/{docker_pool_path(DOCKER_STANDIN)}"] = debs[DOCKER_STANDIN.name]
    for suite in suites():
        indexes = {}
        for arch in architectures():
            binary = f"{DOCKER_COMPONENT}/binary-{arch}"
            indexes.update(_packages_files(binary, render_packages([docker_entry])))
        release = {
            "Origin": "sparkrig lab (stand-in for Docker)",
            "Label": "sparkrig lab Docker stand-in",
            "Suite": suite,
            "Codename": suite,
            "Architectures": " ".join(architectures()),
            "Components": DOCKER_COMPONENT,
            "Date": date,
            "Description": "sparkrig lab stand-in for Docker's apt repository",
        }
        files[f"{DOCKER_ROOT}/dists/{suite}/Release"] = render_release(release, indexes).encode()
        files.update({f"{DOCKER_ROOT}/dists/{suite}/{path}": data for path, data in indexes.items()})

    toolkit_entry = render_packages_entry(
        control_fields(TOOLKIT_STANDIN), f"./{TOOLKIT_STANDIN.deb_name}", debs[TOOLKIT_STANDIN.name]
    )
    for arch in architectures():
        flat = nvidia_flat(arch)
        indexes = _packages_files("", render_packages([toolkit_entry]))
        release = {
            "Origin": "sparkrig lab (stand-in for NVIDIA)",
            "Label": "sparkrig lab NVIDIA container toolkit stand-in",
            "Architectures": arch,
            "Date": date,
            "Description": "sparkrig lab stand-in for NVIDIA's libnvidia-container apt repository",
        }
        files[f"{flat}/Release"] = render_release(release, indexes).encode()
        files.update({f"{flat}/{path}": data for path, data in indexes.items()})
        files[f"{flat}/{TOOLKIT_STANDIN.deb_name}"] = debs[TOOLKIT_STANDIN.name]

    update_debs = update_debs or {}
    updates = [package for package in UPDATE_STANDINS if package.deb_name in update_debs]
    entries = [
        render_packages_entry(control_fields(package), f"./{package.deb_name}", debs[package.name])
        for package in STANDINS
    ] + [
        render_packages_entry(control_fields(package), f"./{package.deb_name}", update_debs[package.deb_name])
        for package in updates
    ]
    indexes = _packages_files("", render_packages(entries))
    release = {
        "Origin": DGX_ORIGIN,
        "Label": "sparkrig lab DGX OS stand-in",
        "Architectures": " ".join(architectures()),
        "Date": date,
        "Description": "sparkrig lab stand-in for the NVIDIA-configured apt sources of DGX OS",
    }
    files[f"{DGX_FLAT}/Release"] = render_release(release, indexes).encode()
    files.update({f"{DGX_FLAT}/{path}": data for path, data in indexes.items()})
    for package in STANDINS:
        files[f"{DGX_FLAT}/{package.deb_name}"] = debs[package.name]
    for package in updates:
        files[f"{DGX_FLAT}/{package.deb_name}"] = update_debs[package.deb_name]
    return files


def _packages_files(directory: str, packages: str) -> dict[str, bytes]:
    prefix = f"{directory}/" if directory else ""
    data = packages.encode()
    return {f"{prefix}Packages": data, f"{prefix}Packages.gz": gzip.compress(data, mtime=0)}


def release_files() -> dict[str, list[str]]:
    """The Release files each key signs, by repository, below the site."""
    return {
        "docker": [f"{DOCKER_ROOT}/dists/{suite}/Release" for suite in suites()],
        "nvidia": [f"{nvidia_flat(arch)}/Release" for arch in architectures()],
        "dgx": [f"{DGX_FLAT}/Release"],
    }


def repo_key(fingerprints: Mapping[str, str]) -> str:
    """A short hash of everything that makes up the served tree."""
    recipe = {
        "packages": [repr(package) for package in STANDINS + UPDATE_STANDINS],
        "suites": suites(),
        "architectures": architectures(),
        "recipe_version": RECIPE_VERSION,
        "fingerprints": dict(sorted(fingerprints.items())),
        "wheelhouse": wheelhouse.recipe(wheelhouse.local_torch_wheels(LOCAL_WHEEL_DIR)),
        "sources": [sourcebuild.RECIPE_VERSION, sourcebuild.COMMITS, sourcebuild.PREFIX_COMMITS],
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


# --- building --------------------------------------------------------------------


def ensure_repo(cache_dir: Path, port: int) -> AptRepo:
    """The built repositories (building them if the recipe or the keys changed)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / "tmp"
    if tmp.is_dir():
        for leftover in tmp.iterdir():
            log.info("removing unfinished apt repository build %s", leftover)
            shutil.rmtree(leftover)
    gnupg = cache_dir / "gnupg"
    fingerprints = _ensure_keys(gnupg)
    site = cache_dir / f"site-{repo_key(fingerprints)}"
    if not site.is_dir():
        _build(site, gnupg, fingerprints)
        for other in cache_dir.glob("site-*"):
            if other != site:
                log.info("removing outdated apt repositories %s", other.name)
                shutil.rmtree(other)
    return AptRepo(site, fingerprints["docker"], fingerprints["nvidia"], port, fingerprints["dgx"])


def _gpg(home: Path, *args: str | os.PathLike[str]) -> str:
    argv = ["gpg", "--homedir", home, "--batch", "--no-tty"]
    argv += ["--pinentry-mode", "loopback", "--passphrase", "", *args]
    return run(argv, timeout=120).stdout


def _stop_gpg_agent(home: Path) -> None:
    """Stop the gpg-agent (and any other daemon) gpg started for ``home``."""
    run(["gpgconf", "--homedir", home, "--kill", "all"], check=False)


def _fingerprints(home: Path) -> dict[str, str]:
    by_uid = parse_gpg_fingerprints(_gpg(home, "--with-colons", "--list-secret-keys"))
    return {repo: by_uid[uid] for repo, uid in KEY_UIDS.items() if uid in by_uid}


def _ensure_keys(gnupg: Path) -> dict[str, str]:
    """The signing keys' fingerprints by repository, making the keys once (atomically)."""
    if gnupg.is_dir():
        try:
            fingerprints = _fingerprints(gnupg)
        finally:
            _stop_gpg_agent(gnupg)
        if fingerprints.keys() == KEY_UIDS.keys():
            return fingerprints
        log.warning("%s lacks a signing key: making new keys", gnupg)
        shutil.rmtree(gnupg)
    log.info("making the apt repositories' signing keys in %s", gnupg)
    new = Path(tempfile.mkdtemp(dir=gnupg.parent, prefix=f".{gnupg.name}."))
    try:
        for uid in KEY_UIDS.values():
            _gpg(new, "--quick-gen-key", uid, "ed25519", "sign", "never")
        fingerprints = _fingerprints(new)
        _stop_gpg_agent(new)
        new.rename(gnupg)
    except BaseException:
        _stop_gpg_agent(new)
        shutil.rmtree(new, ignore_errors=True)
        raise
    return fingerprints


def _build(final: Path, gnupg: Path, fingerprints: Mapping[str, str]) -> None:
    started = time.monotonic()
    (final.parent / "tmp").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=final.parent / "tmp", prefix=f"{final.name}."))
    site = work / "site"
    log.info("building the lab's apt repositories %s", final.name)
    try:
        debs = {package.name: _build_deb(package, work) for package in STANDINS}
        update_debs = {package.deb_name: _build_deb(package, work) for package in UPDATE_STANDINS}
        now = datetime.datetime.now(datetime.timezone.utc)
        for path, data in site_files(debs, release_date(now), update_debs).items():
            _write_bytes(site / path, data)
        wheelhouse.build(site, wheelhouse.local_torch_wheels(LOCAL_WHEEL_DIR))
        sourcebuild.build(site)
        try:
            for repo, public_key in PUBLIC_KEYS.items():
                target = site / public_key
                _gpg(gnupg, "--armor", "--output", target, "--export", fingerprints[repo])
            for repo, releases in release_files().items():
                for release in releases:
                    _sign(gnupg, fingerprints[repo], site / release)
        finally:
            _stop_gpg_agent(gnupg)
        for path in [site, *site.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        site.rename(final)
    finally:
        shutil.rmtree(work)
    log.info("apt repositories %s ready after %.1f s", final.name, time.monotonic() - started)


def _build_deb(package: StandinPackage, work: Path) -> bytes:
    stage = work / f"stage-{package.name}-{package.version}"
    control = stage / "DEBIAN" / "control"
    _write_bytes(control, render_deb822(control_fields(package)).encode())
    for file in package.files:
        target = stage / file.path.lstrip("/")
        _write_bytes(target, file.content.encode())
        os.chmod(target, file.mode)
    for directory in [stage, *(path for path in stage.rglob("*") if path.is_dir())]:
        os.chmod(directory, 0o755)
    deb = work / package.deb_name
    run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", stage, deb])
    return deb.read_bytes()


def _sign(gnupg: Path, fingerprint: str, release: Path) -> None:
    """InRelease (clearsigned) and Release.gpg (detached, armored) beside ``release``."""
    signer = ["--local-user", f"{fingerprint}!", "--digest-algo", "SHA512"]
    _gpg(gnupg, *signer, "--clearsign", "--output", release.with_name("InRelease"), release)
    _gpg(
        gnupg,
        *signer,
        "--armor",
        "--detach-sign",
        "--output",
        release.with_name("Release.gpg"),
        release,
    )


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# --- serving ---------------------------------------------------------------------


def start_server(repo: AptRepo, addresses: Sequence[str], pid_file: Path, log_file: Path) -> int:
    """Start the HTTP server on ``addresses`` (detached, outlives ``up``); its PID.

    Returns once every address is bound; raises with the server's log if it exits first.
    """
    script = Path(__file__).with_name(REPO_SERVER_SCRIPT)
    argv = [sys.executable, "-I", script, "--root", repo.root, "--port", str(repo.port), *addresses]
    pid = spawn(argv, log_file, {}, [])
    write_file(pid_file, f"{pid}\n")
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while not any(line.startswith(READY) for line in tail(log_file).splitlines()):
        if not pid_alive(pid):
            raise LabError(f"the apt repository server exited; end of {log_file}:\n{tail(log_file)}")
        if time.monotonic() > deadline:
            raise LabError(f"the apt repository server did not start in {SERVER_START_TIMEOUT_S:.0f} s")
        time.sleep(0.1)
    urls = ", ".join(f"http://{address}:{repo.port}" for address in addresses)
    log.info("apt repositories served at %s (pid %d)", urls, pid)
    return pid


def stop_server(pid_file: Path, repo_cache: Path) -> None:
    """Stop the server: the one in ``pid_file`` and any other found serving below ``repo_cache``."""
    pids = lab_repo_server_pids(repo_cache, pid_file)
    if pids:
        log.info("stopping the apt repository server %s", pids)
        stop_processes(pids, STOP_GRACE_S)
    pid_file.unlink(missing_ok=True)
