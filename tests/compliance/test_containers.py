"""
Container controls: Docker runs and starts at boot, the nvidia runtime is registered
(and the default when asked), a container really runs (with the GPUs where there are
any), the user's own daemon.json survived, the vendor repositories are trusted with
their own key alone, and only the named users hold the root-equivalent docker group.

What the host must look like is worked out here from the settings, independently of
the code that converges (operations/containers/).
"""

from __future__ import annotations

import json
import re

import pytest

from .conftest import inventory_name
from .reads import need

SERVICE = "docker.service"
DAEMON_JSON = "/etc/docker/daemon.json"
BACKUP = "/etc/docker/daemon.json.sparkrig-old"
# The stand-in image the lab imports (busybox-static, from the lab image): the lab has
# no registry access for Docker Hub.
LAB_IMAGE_ROOTFS = (
    "mkdir -p {d}/bin && cp /bin/busybox {d}/bin/ && ln -sf busybox {d}/bin/true && ln -sf busybox {d}/bin/sh"
)


@pytest.fixture
def docker(host, read):
    """The host, which must have Docker: every host sparkrig converges runs it."""
    _has_docker(read(docker_present))
    return host


def _has_docker(found) -> None:
    if not found["systemd"].is_directory:
        pytest.skip("this host does not run systemd (no /run/systemd/system): Docker cannot run as a service")
    assert found["dockerd"].rc == 0, "dockerd is not installed"


@need
def docker_present(r) -> dict:
    """Whether the host runs systemd, and has dockerd."""
    return {"systemd": r.path("/run/systemd/system"), "dockerd": r.run("command -v dockerd", sudo=True)}


@need
def state(r) -> dict:
    """What the read-only container controls read of the host."""
    found = {
        **docker_present(r),
        "service": r.service(SERVICE),
        # One docker info for both (each asks dockerd for everything: 45 ms of a host's CPU).
        "info": r.run("docker info --format %s", "{{json .Runtimes}}\n{{.DefaultRuntime}}", sudo=True),
        "paths": {
            path: r.path(path)
            for path in (BACKUP, DAEMON_JSON, "/run/docker.sock", "/dev/nvidiactl", "/etc/cdi/nvidia.yaml")
        },
        "backup": r.file(BACKUP, sudo=True),
        "daemon_json": r.file(DAEMON_JSON, sudo=True),
        "cmdline": r.run(
            "tr '\\0' ' ' < /proc/$(systemctl show --property MainPID --value %s)/cmdline", SERVICE, sudo=True
        ),
        "cdi_refresh": r.service("nvidia-cdi-refresh.path", exists=True),
        "nvidia_ctk": r.run("command -v nvidia-ctk"),
        "groups": {user: r.run("id -nG %s", user) for user in r.settings["containers_docker_users"]},
        "os_release": r.file("/etc/os-release"),
        "arch": r.run("dpkg --print-architecture"),
        "entries": r.run(
            "grep -s -H -E '^[[:space:]]*(deb|deb-src|URIs:)[[:space:]]' "
            "/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources"
        ),
        "repos": {},
    }
    for repo in _vendors(r.settings):
        sources = f"/etc/apt/sources.list.d/sparkrig-{repo['name']}.sources"
        keyring = f"/etc/apt/keyrings/sparkrig-{repo['name']}.gpg"
        found["repos"][repo["name"]] = {
            "sources": r.path(sources),
            "content": r.file(sources),
            "keyring": r.path(keyring),
            "keys": r.run(
                "t=$(mktemp -d) && gpg --homedir $t --batch --with-colons --show-keys %s; rm -rf $t", keyring
            ),
        }
    packages = sorted({package for repo in _vendors(r.settings) for package in repo["packages"]})
    if packages:
        # One apt-cache for every package: each start loads apt's cache (about a second on
        # a host with many lists), and its output names each package on a line of its own.
        found["policy"] = r.run("apt-cache policy" + " %s" * len(packages), *packages)
    return found


def _policies(text: str) -> dict[str, list[str]]:
    """``apt-cache policy A B ...``'s output, by package: its lines under ``A:``."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = sections.setdefault(line[:-1].split(":")[0], [])
        else:
            current.append(line)
    return sections


@pytest.fixture
def dockerd(read) -> dict:
    """What the host says of Docker, which it must have: every host sparkrig converges runs it."""
    found = read(state)
    _has_docker(found)
    return found


@pytest.fixture
def check_image(docker, settings, host_data):
    """The image the controls run; a lab host (no registry) imports its stand-in when it is missing."""
    image = settings["containers_check_image"]
    data = host_data.get(inventory_name(docker), {})
    lab_host = "lab_flavour" in data
    if data.get("lab_emulated"):
        pytest.skip(
            "lab host under qemu-user emulation: containerd's runc shim cannot start a container "
            "there ('failed to start shim: invalid argument'); a real GB10 runs them natively"
        )
    with docker.sudo():
        present = docker.run("docker image inspect %s", image).rc == 0
        if not present and lab_host:
            d = "/tmp/sparkrig-lab-image"
            docker.check_output(
                f"rm -rf {d} && {LAB_IMAGE_ROOTFS.format(d=d)} && tar -C {d} -c . | docker import - %s", image
            )
    return image


def _info(dockerd) -> tuple[str, str]:
    """docker info's runtimes (JSON) and default runtime."""
    lines = dockerd["info"].check().splitlines()
    assert len(lines) == 2, f"docker info printed {len(lines)} lines, not the runtimes and the default"
    return lines[0], lines[1].strip()


def test_docker_is_enabled_and_running(dockerd):
    """Protects against training containers that do not come back after a reboot:
    docker.service must be enabled as well as running."""
    service = dockerd["service"]
    assert service.is_running, f"{SERVICE} is not running"
    assert service.is_enabled, f"{SERVICE} is not enabled: it will not start at boot"


def test_nvidia_runtime_is_registered(dockerd):
    """Protects against "unknown or invalid runtime name: nvidia" (seen on Sparks whose
    toolkit was installed but never registered with Docker)."""
    runtimes = json.loads(_info(dockerd)[0])
    assert "nvidia" in runtimes, f"docker info lists the runtimes {sorted(runtimes)}, not nvidia"


def test_default_runtime_is_as_configured(dockerd, settings):
    """Protects against GPU containers that silently run without the NVIDIA hook (nvidia
    not the default when asked), and against a default changed behind the user's back."""
    default = _info(dockerd)[1]
    if settings["containers_nvidia_default_runtime"]:
        assert default == "nvidia", f"the default runtime is {default}, containers_nvidia_default_runtime is True"
    else:
        assert default != "nvidia", "nvidia is the default runtime, containers_nvidia_default_runtime is False"


def test_user_daemon_json_keys_survived(dockerd):
    """Protects against a deploy that overwrites the user's daemon.json (log driver, data
    root, registry mirrors): every key of the file sparkrig last replaced is still there
    with its value, apart from the runtime settings sparkrig manages."""
    if not dockerd["paths"][BACKUP].exists:
        pytest.skip(f"no {BACKUP}: sparkrig never replaced an existing daemon.json on this host")
    before = json.loads(dockerd["backup"].check())
    after = json.loads(dockerd["daemon_json"].check())
    managed = {"default-runtime"}
    for key, value in before.items():
        if key in managed:
            continue
        if key == "runtimes":
            for name, runtime in value.items():
                assert after["runtimes"].get(name) == runtime, f"runtime {name} changed or lost"
            continue
        assert key in after, f"{DAEMON_JSON} lost the user's key {key!r}"
        assert after[key] == value, f"{DAEMON_JSON} changed the user's {key!r}: {value!r} -> {after[key]!r}"


def test_daemon_json_is_root_owned_and_not_writable_by_others(dockerd):
    """Protects against privilege escalation: whoever can write daemon.json chooses the
    binaries dockerd runs as root (runtimes) and where it keeps its data."""
    config = dockerd["paths"][DAEMON_JSON]
    assert config.exists, f"{DAEMON_JSON} is missing: the nvidia runtime cannot be registered"
    assert (config.user, config.group) == ("root", "root")
    assert config.mode & 0o022 == 0, f"{DAEMON_JSON} is writable by group or others: {oct(config.mode)}"


def test_docker_api_is_not_exposed_on_tcp(dockerd):
    """Protects against remote root: Docker's API on a TCP socket without TLS lets anyone
    who reaches the port run a privileged container."""
    cmdline = dockerd["cmdline"].check()
    assert "tcp://" not in cmdline, f"dockerd listens on TCP: {cmdline}"
    hosts = json.loads(dockerd["daemon_json"].check()).get("hosts", [])
    assert not [h for h in hosts if h.startswith("tcp://")], f"daemon.json asks for TCP hosts: {hosts}"
    sock = dockerd["paths"]["/run/docker.sock"]
    assert sock.is_socket and sock.user == "root" and sock.mode & 0o007 == 0, "docker.sock is open to others"


@pytest.mark.action
def test_a_container_runs_with_the_nvidia_runtime(docker, check_image):
    """Protects against a runtime that is registered but broken (wrong path, missing
    binary): a container started with --runtime=nvidia must run to completion."""
    with docker.sudo():
        result = docker.run("docker run --rm --runtime=nvidia %s true", check_image)
    assert result.rc == 0, f"docker run --runtime=nvidia {check_image} true failed: {result.stderr}"


@pytest.mark.action
def test_gpus_are_visible_in_a_container(docker, check_image):
    """Protects against containers that start but see no GPU: the toolkit's hook (or CDI)
    must hand the GPUs and nvidia-smi to the container."""
    if not docker.file("/dev/nvidiactl").exists:
        pytest.skip("this host has no NVIDIA GPU (/dev/nvidiactl is missing): nothing to hand to a container")
    with docker.sudo():
        result = docker.run("docker run --rm --gpus all %s nvidia-smi -L", check_image)
    assert result.rc == 0, f"docker run --gpus all {check_image} nvidia-smi -L failed: {result.stderr}"
    assert "GPU 0:" in result.stdout


def test_cdi_specification_is_kept(dockerd):
    """Protects against "unresolvable CDI devices": with CDI, a container's GPUs are only
    as current as the specification; nvidia-cdi-refresh (toolkit 1.18+) keeps it current."""
    refresh = dockerd["cdi_refresh"]
    if refresh.exists:
        assert refresh.is_enabled and refresh.is_running, "nvidia-cdi-refresh.path is not enabled and active"
        return
    if not (dockerd["paths"]["/dev/nvidiactl"].exists and dockerd["nvidia_ctk"].rc == 0):
        pytest.skip("no GPU or no nvidia-ctk on this host: there is no CDI specification to keep")
    assert dockerd["paths"]["/etc/cdi/nvidia.yaml"].exists, "/etc/cdi/nvidia.yaml is missing"


def test_configured_users_are_in_the_docker_group(dockerd, settings):
    """Protects against the "permission denied ... docker.sock" that sends users to sudo
    for every container, for exactly the users the settings name (membership is
    root-equivalent)."""
    users = settings["containers_docker_users"]
    if not users:
        pytest.skip("containers_docker_users is empty: nobody is meant to join the docker group")
    for user in users:
        assert "docker" in dockerd["groups"][user].check().split(), f"{user} is not in the docker group"


def _release(found) -> dict[str, str]:
    os_release = dict(line.split("=", 1) for line in found["os_release"].check().splitlines() if "=" in line)
    return {
        "os": os_release["ID"].strip('"'),
        "codename": os_release.get("VERSION_CODENAME", "").strip('"'),
        "arch": found["arch"].check(),
    }


def _vendors(settings) -> list[dict[str, str]]:
    return [
        {
            "name": "docker",
            "source": settings["containers_docker_source"],
            "vendor": "docker-ce",
            "url": settings["containers_docker_repo_url"],
            "fingerprint": settings["containers_docker_key_fingerprint"],
            "packages": settings["containers_docker_ce_packages"],
        },
        {
            "name": "nvidia-container-toolkit",
            "source": settings["containers_toolkit_source"],
            "vendor": "nvidia",
            "url": settings["containers_toolkit_repo_url"],
            "fingerprint": settings["containers_toolkit_key_fingerprint"],
            "packages": settings["containers_toolkit_packages"],
        },
    ]


def _repositories(settings, found) -> list[dict[str, str]]:
    """The vendor repositories sparkrig must have configured: those the settings name, and
    under "auto" those whose sparkrig sources file exists (auto chose the vendor's)."""
    return [
        repo
        for repo in _vendors(settings)
        if repo["source"] == repo["vendor"]
        or (repo["source"] == "auto" and found["repos"][repo["name"]]["sources"].exists)
    ]


def _source_entries(found) -> list[tuple[str, str]]:
    """(file, URI) of every apt source entry on the host."""
    listing = found["entries"]
    entries = []
    for line in listing.stdout.splitlines():
        path, _, entry = line.partition(":")
        words = re.sub(r"\[[^\]]*\]", " ", entry).split()  # one-line options: [arch=... signed-by=...]
        if words[:1] == ["URIs:"]:
            entries += [(path, uri) for uri in words[1:]]
        elif len(words) > 1:
            entries.append((path, words[1]))
    return entries


def test_no_vendor_repository_is_configured_twice(dockerd, settings):
    """Protects against a second copy of a repository the box already has (DGX OS ships
    its own sources): apt then refuses to work ("Conflicting values set for option
    Signed-By"), and upgrades stop. At most one file names each vendor's origin."""
    entries = _source_entries(dockerd)
    for repo in _vendors(settings):
        origin = repo["url"].split("://", 1)[-1].split("{", 1)[0].rstrip("/")
        files = sorted(
            {path for path, uri in entries if (uri.split("://", 1)[-1].rstrip("/") + "/").startswith(origin + "/")}
        )
        assert len(files) <= 1, f"{origin} is configured in {len(files)} files: {files}"


def test_vendor_repositories_trust_their_own_key_alone(dockerd, settings):
    """Protects against packages signed by the wrong key: each vendor repository is
    trusted only with its own keyring (Signed-By), and that keyring holds exactly the
    key whose fingerprint the settings name; neither file is writable by others."""
    repos = _repositories(settings, dockerd)
    if not repos:
        pytest.skip(
            "no vendor repository is configured by sparkrig here (sources 'preinstalled' or 'distro', "
            "or 'auto' keeping what the host had)"
        )
    release = _release(dockerd)
    for repo in repos:
        found = dockerd["repos"][repo["name"]]
        sources = found["sources"]
        keyring = f"/etc/apt/keyrings/sparkrig-{repo['name']}.gpg"
        assert sources.exists, f"{sources.path} is missing"
        fields = dict(
            line.split(": ", 1)
            for line in found["content"].check().splitlines()
            if ": " in line and not line.startswith("#")
        )
        assert fields["URIs"] == repo["url"].format(**release)
        assert fields["Signed-By"] == keyring
        listing = found["keys"].check()
        primary = [
            line.split(":")[9]
            for i, line in enumerate(listing.splitlines()[1:], 1)
            if line.startswith("fpr") and listing.splitlines()[i - 1].startswith("pub")
        ]
        assert primary == [repo["fingerprint"]], f"{keyring} holds {primary}, not {repo['fingerprint']}"
        for path, f in ((sources.path, sources), (keyring, found["keyring"])):
            assert f.user == "root" and f.mode & 0o022 == 0, f"{path} is writable by others"


def test_packages_come_from_the_configured_repository(dockerd, settings):
    """Protects against a vendor package silently installed from somewhere else (a stale
    list, another mirror): the installed version's origin is the configured repository."""
    repos = _repositories(settings, dockerd)
    if not repos:
        pytest.skip(
            "no vendor repository is configured by sparkrig here (sources 'preinstalled' or 'distro', "
            "or 'auto' keeping what the host had)"
        )
    release = _release(dockerd)
    policies = _policies(dockerd["policy"].check())
    for repo in repos:
        url = repo["url"].format(**release).rstrip("/")
        for package in repo["packages"]:
            lines = policies.get(package, [])
            installed = next((line.split(":", 1)[1].strip() for line in lines if "Installed:" in line), "(none)")
            assert installed != "(none)", f"{package} is not installed"
            at = next(i for i, line in enumerate(lines) if line.strip().startswith(("*** " + installed)))
            origins = [line.split()[1] for line in lines[at + 1 :] if line.startswith("        ")]
            assert any(origin.rstrip("/").startswith(url) for origin in origins), (
                f"{package} {installed} comes from {origins}, not {url}"
            )
