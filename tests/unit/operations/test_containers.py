"""Containers: settings, repositories and their files, the key check, the daemon.json merge,
the facts, and the plan for fresh, converged and refused hosts."""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from sparkrig import atomic, host_output
from sparkrig.operations import (
    ca_certificates,
    containers,
    cuda_env,
    hardware,
    jobs,
    ngc,
    python_stack,
    source_builds,
    sshd_guard,
    swap,
)
from sparkrig.operations import containers as ct
from sparkrig.operations.containers import facts as ct_facts
from sparkrig.operations.containers import operations as ct_ops
from sparkrig.operations.containers import repositories as ct_repos
from sparkrig.operations.containers import settings as ct_settings
from sparkrig.settings import defaults, problems
from tests.unit import pyinfra_fake
from tests.unit.pyinfra_fake import PlannedOp, digest, execute, plan

DEFAULTS = defaults(ct.SETTINGS)
# The vendors' repositories chosen outright (the default, "auto", decides from the host).
VENDOR = {**DEFAULTS, "containers_docker_source": "docker-ce", "containers_toolkit_source": "nvidia"}
NOBLE_ARM = {"os": "ubuntu", "codename": "noble", "arch": "arm64"}


# Settings --------------------------------------------------------------------


def test_defaults_are_valid():
    assert problems(ct.SETTINGS, {}) == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"containers_docker_source": "snap"}, "allowed is one of 'auto', 'docker-ce', 'distro', 'preinstalled'"),
        ({"containers_toolkit_source": "distro"}, "allowed is one of 'auto', 'nvidia', 'preinstalled'"),
        ({"containers_docker_repo_url": "ftp://mirror/docker"}, "allowed is an http:// or https:// URL"),
        ({"containers_docker_repo_url": "https://mirror/{distro}"}, "placeholders are {os}, {codename}"),
        ({"containers_toolkit_key_url": "https://mirror/key'; rm -rf /"}, "without quotes, spaces"),
        ({"containers_docker_key_fingerprint": "9dc858229fc7dd38854ae2d88d81803c0ebfcd88"}, "upper-case hex"),
        ({"containers_toolkit_key_fingerprint": "DDCAE044F796ECB0"}, "40 upper-case hex digits"),
        ({"containers_docker_ce_packages": []}, "a non-empty list of Debian package names"),
        ({"containers_toolkit_packages": "nvidia-container-toolkit"}, "a non-empty list"),
        ({"containers_toolkit_packages": ["nvidia container toolkit"]}, "a non-empty list"),
        ({"containers_nvidia_default_runtime": "yes"}, "allowed is True or False"),
        ({"containers_docker_users": "spark"}, "a list of user names"),
        ({"containers_docker_users": ["Spark"]}, "a list of user names"),
        ({"containers_docker_users": ["spark; id"]}, "a list of user names"),
        ({"containers_check_image": "Ubuntu:24.04"}, "a docker image reference"),
        ({"containers_check_image": "ubuntu:24.04 --privileged"}, "a docker image reference"),
        ({"containers_docker_user": ["spark"]}, "not a sparkrig setting (did you mean containers_docker_users?)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(ct.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu:24.04",
        "nvcr.io/nvidia/pytorch:25.11-py3",
        "registry.lab:5000/team/cuda",
        "busybox",
        "ubuntu@sha256:" + "a" * 64,
    ],
)
def test_image_references_are_allowed(image):
    assert ct_settings.image_check(image, {}) is None


# Repositories ----------------------------------------------------------------


def test_default_repositories_are_the_vendors_with_host_values_filled_in():
    docker, toolkit = ct_repos.repositories(VENDOR, NOBLE_ARM)
    assert docker == ct_repos.AptRepository(
        "docker",
        "https://download.docker.com/linux/ubuntu",
        "noble",
        ("stable",),
        "https://download.docker.com/linux/ubuntu/gpg",
        "9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
        "download.docker.com/linux",
    )
    assert toolkit == ct_repos.AptRepository(
        "nvidia-container-toolkit",
        "https://nvidia.github.io/libnvidia-container/stable/deb/arm64",
        "/",
        (),
        "https://nvidia.github.io/libnvidia-container/gpgkey",
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
        "nvidia.github.io/libnvidia-container/stable/deb",
    )
    assert docker.keyring == "/etc/apt/keyrings/sparkrig-docker.gpg"
    assert toolkit.sources_file == "/etc/apt/sources.list.d/sparkrig-nvidia-container-toolkit.sources"


@pytest.mark.parametrize(
    ("docker", "toolkit", "names"),
    [
        ("distro", "nvidia", ["nvidia-container-toolkit"]),
        ("preinstalled", "preinstalled", []),
        ("docker-ce", "preinstalled", ["docker"]),
    ],
)
def test_only_the_repositories_the_sources_need(docker, toolkit, names):
    data = {**DEFAULTS, "containers_docker_source": docker, "containers_toolkit_source": toolkit}
    assert [repo.name for repo in ct_repos.repositories(data, NOBLE_ARM)] == names


def test_sources_files_are_deb822_with_their_own_keyring():
    docker, toolkit = ct_repos.repositories(VENDOR, NOBLE_ARM)
    text = ct_repos.render_sources(docker, "arm64")
    assert text.splitlines()[2:] == [
        "Types: deb",
        "URIs: https://download.docker.com/linux/ubuntu",
        "Suites: noble",
        "Components: stable",
        "Architectures: arm64",
        "Signed-By: /etc/apt/keyrings/sparkrig-docker.gpg",
    ]
    flat = ct_repos.render_sources(toolkit, "arm64")
    assert "Suites: /\n" in flat and "Components" not in flat
    assert "Signed-By: /etc/apt/keyrings/sparkrig-nvidia-container-toolkit.gpg\n" in flat


@pytest.mark.skipif(not shutil.which("apt-get"), reason="needs apt-get to parse the sources files")
def test_apt_reads_both_sources_files_as_intended(tmp_path):
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    for repo in ct_repos.repositories(VENDOR, NOBLE_ARM):
        (parts / Path(repo.sources_file).name).write_text(ct_repos.render_sources(repo, "arm64"))
    result = subprocess.run(
        [
            "apt-get",
            "indextargets",
            "--no-release-info",
            "--format",
            "$(URI)",
            "-o",
            "Dir::Etc::SourceList=/dev/null",
            "-o",
            f"Dir::Etc::SourceParts={parts}",
            "-o",
            "APT::Architecture=arm64",
            "-o",
            f"Dir::State::Lists={tmp_path}",
            "Identifier: Packages",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == [
        "https://download.docker.com/linux/ubuntu/dists/noble/stable/binary-all/Packages",
        "https://download.docker.com/linux/ubuntu/dists/noble/stable/binary-arm64/Packages",
        "https://nvidia.github.io/libnvidia-container/stable/deb/arm64/Packages",
    ]


@pytest.mark.parametrize(
    ("line", "uris"),
    [
        (
            "deb [arch=arm64 signed-by=/etc/apt/keyrings/docker.asc] "
            "https://download.docker.com/linux/ubuntu noble stable",
            ["https://download.docker.com/linux/ubuntu"],
        ),
        (
            "  deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /",
            ["https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"],
        ),
        ("URIs: http://a/ http://b", ["http://a/", "http://b"]),
        ("deb-src http://deb.debian.org/debian bookworm main", ["http://deb.debian.org/debian"]),
    ],
)
def test_source_uris_in_both_formats(line, uris):
    assert ct_repos.source_uris(line) == uris


def test_a_repository_configured_by_another_file_is_found_and_our_own_file_is_not():
    docker, _ = ct_repos.repositories(VENDOR, NOBLE_ARM)
    entries = [
        (docker.sources_file, "URIs: https://download.docker.com/linux/ubuntu"),
        (
            "/etc/apt/sources.list.d/docker.list",
            "deb [arch=arm64 signed-by=/etc/apt/keyrings/docker.asc] "
            "https://download.docker.com/linux/ubuntu/ noble stable",
        ),
        ("/etc/apt/sources.list.d/ubuntu.sources", "URIs: http://ports.ubuntu.com/ubuntu-ports/"),
    ]
    assert ct_repos.foreign_sources(entries, docker) == ["/etc/apt/sources.list.d/docker.list"]
    assert ct_repos.foreign_sources(entries[:1] + entries[2:], docker) == []


# The key check, run for real with curl and gpg ---------------------------------

needs_gpg = pytest.mark.skipif(
    not (shutil.which("gpg") and shutil.which("curl")), reason="needs gpg and curl on this machine"
)


def _make_key(home: Path, uid: str) -> str:
    subprocess.run(
        [
            "gpg",
            "--homedir",
            str(home),
            "--batch",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            uid,
            "ed25519",
            "sign",
            "never",
        ],
        check=True,
        capture_output=True,
    )
    listing = subprocess.run(
        ["gpg", "--homedir", str(home), "--with-colons", "--list-keys", uid],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))


@pytest.fixture(scope="module")
def two_keys(tmp_path_factory):
    """Two armored public keys (with a subkey each) in one file and alone, and their fingerprints."""
    base = tmp_path_factory.mktemp("keys")
    home = base / "gnupg"
    home.mkdir(mode=0o700)
    first = _make_key(home, "sparkrig test one <one@example.invalid>")
    second = _make_key(home, "sparkrig test two <two@example.invalid>")
    for fpr in (first, second):
        subprocess.run(
            [
                "gpg",
                "--homedir",
                str(home),
                "--batch",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                "--quick-add-key",
                fpr,
                "cv25519",
                "encr",
                "never",
            ],
            check=True,
            capture_output=True,
        )

    def export(*fprs: str) -> Path:
        path = base / ("-".join(f[-8:] for f in fprs) + ".asc")
        path.write_bytes(
            subprocess.run(
                ["gpg", "--homedir", str(home), "--armor", "--export", *fprs], check=True, capture_output=True
            ).stdout
        )
        return path

    yield {"first": first, "second": second, "first_file": export(first), "both_file": export(first, second)}
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)


def test_the_key_script_reads_the_primary_fingerprints_as_the_fact_does():
    """templates/containers/fetch-key.sh holds the fact's awk program, word for word."""
    assert ct_facts.PRIMARY_FINGERPRINTS in ct_repos.FETCH_KEY


def _fetch(url: str, fingerprint: str, keyring: Path):
    return subprocess.run(
        ["sh", "-c", ct_repos.FETCH_KEY, "fetch-key", url, fingerprint, str(keyring)], capture_output=True, text=True
    )


def _fingerprints(keyring: Path, tmp_path: Path) -> list[str]:
    """What the SparkrigAptRepositories fact reads from a keyring."""
    command = ct_facts.SparkrigAptRepositories().command(names=["x"]).get_raw_value()
    command = command.replace("/etc/apt/keyrings/sparkrig-x.gpg", str(keyring))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, cwd=tmp_path).stdout
    lines = [line for line in out.splitlines() if line.startswith("key x")]
    return ct_facts.SparkrigAptRepositories().process(lines)["x"]["fingerprints"]


@needs_gpg
@pytest.mark.skipif(os.geteuid() != 0, reason="install -o root needs root")
def test_key_with_the_right_fingerprint_is_installed_alone(two_keys, tmp_path):
    keyring = tmp_path / "keyrings" / "sparkrig-x.gpg"
    result = _fetch(f"file://{two_keys['both_file']}", two_keys["second"], keyring)
    assert result.returncode == 0, result.stderr
    # Only the expected key (with its subkey) is in the keyring; the fact reads its primary fingerprint.
    assert _fingerprints(keyring, tmp_path) == [two_keys["second"]]
    assert oct(keyring.stat().st_mode & 0o777) == "0o644"
    assert not list(keyring.parent.glob("*.sparkrig-new"))


@needs_gpg
def test_key_with_another_fingerprint_is_refused_and_nothing_is_written(two_keys, tmp_path):
    keyring = tmp_path / "keyrings" / "sparkrig-x.gpg"
    result = _fetch(f"file://{two_keys['first_file']}", two_keys["second"], keyring)
    assert result.returncode == 1
    assert f"has fingerprint(s) '{two_keys['first']}', not {two_keys['second']}: refusing it" in result.stderr
    assert not keyring.parent.exists()


@needs_gpg
def test_unreachable_key_url_fails_with_its_url(tmp_path):
    result = _fetch(f"file://{tmp_path}/missing.asc", "A" * 40, tmp_path / "k.gpg")
    assert result.returncode == 1
    assert f"cannot download file://{tmp_path}/missing.asc" in result.stderr


# daemon.json -----------------------------------------------------------------


USER_CONFIG = {"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "data-root": "/srv/docker"}


def test_a_right_file_needs_no_change_and_a_missing_one_is_created():
    merged = ct_ops.daemon_json_change(json.dumps(USER_CONFIG), False)
    assert ct_ops.daemon_json_change(merged, False) is None
    # Reformatted by the user (or written by nvidia-ctk): same content, no change.
    assert ct_ops.daemon_json_change(json.dumps(json.loads(merged), indent=8, sort_keys=True), False) is None
    assert json.loads(ct_ops.daemon_json_change(None, False)) == {"runtimes": {"nvidia": ct_ops.NVIDIA_RUNTIME}}
    assert ct_ops.daemon_json_change("", False) is not None


def test_merge_keeps_every_user_key_and_adds_the_runtime():
    merged = ct_ops.merged_daemon_config(USER_CONFIG, default_runtime=False)
    assert merged == {**USER_CONFIG, "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    assert list(merged)[:3] == list(USER_CONFIG)  # the user's order is kept
    assert USER_CONFIG == {"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "data-root": "/srv/docker"}


def test_merge_keeps_an_existing_registration_and_other_runtimes():
    current = {
        "runtimes": {
            "nvidia": {"path": "/usr/bin/nvidia-container-runtime", "args": []},
            "crun": {"path": "/usr/bin/crun"},
        }
    }
    assert ct_ops.merged_daemon_config(current, default_runtime=False) == current


def test_merge_sets_and_unsets_the_default_runtime():
    on = ct_ops.merged_daemon_config(USER_CONFIG, default_runtime=True)
    assert on["default-runtime"] == "nvidia"
    off = ct_ops.merged_daemon_config(on, default_runtime=False)
    assert "default-runtime" not in off
    crun = ct_ops.merged_daemon_config({"default-runtime": "crun"}, default_runtime=False)
    assert crun["default-runtime"] == "crun"


def test_nvidia_ctk_output_is_already_merged():
    # What `nvidia-ctk runtime configure --runtime=docker` writes: sparkrig accepts it as is.
    ctk = {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    assert ct_ops.merged_daemon_config(ctk, default_runtime=False) == ctk


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"log-driver": "json-file",}', "it is not valid JSON (Expecting property name"),
        ('["a"]', "it is not a JSON object"),
    ],
)
def test_unusable_daemon_json_says_why(text, why):
    with pytest.raises(ValueError, match=rf"^{why.replace('(', '[(]')}"):
        ct_ops.parse_daemon_json(text)


def test_runtimes_that_is_not_an_object_is_refused():
    with pytest.raises(ValueError, match='"runtimes" is not a JSON object'):
        ct_ops.merged_daemon_config({"runtimes": []}, default_runtime=False)


@pytest.mark.skipif(
    shutil.which("dockerd") is not None, reason="tests the fallback for hosts without dockerd --validate"
)
def test_daemon_json_check_falls_back_to_a_json_parse(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(ct_ops.daemon_json_change(json.dumps(USER_CONFIG), False))
    bad.write_text('{"runtimes": ')
    check = ["sh", "-c", ct_ops.DAEMON_JSON_CHECK, "daemon-json-check"]
    assert subprocess.run([*check, str(good)], capture_output=True).returncode == 0
    assert subprocess.run([*check, str(bad)], capture_output=True).returncode != 0


# Facts -----------------------------------------------------------------------


def test_container_host_fact_command_runs_and_parses_here():
    command = (
        ct_facts.ContainerHost()
        .command(packages=("dpkg", "no-such-package-x"), users=("root", "no-such-user-x"))
        .get_raw_value()
    )
    result = subprocess.run(["dash", "-c", command], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = ct_facts.ContainerHost().process(result.stdout.splitlines())
    release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().split() if "=" in line)
    assert found["os"] == release["ID"].strip('"')
    assert (
        found["arch"] == subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    )
    assert found["users"] == ["root"]
    assert found["installed"] == ["dpkg"]
    # Whatever this machine has: a newcomer's may run Docker (a lab host has a daemon.json).
    daemon_json = Path("/etc/docker/daemon.json")
    assert found["daemon_json"] == (daemon_json.read_text() if daemon_json.is_file() else None)
    assert (found["dockerd"] is None) == (shutil.which("dockerd") is None)


def test_container_host_fact_reads_a_dgx_os_like_host():
    daemon_json = '{\n  "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}\n}\n'
    output = [
        "os=ubuntu",
        "codename=noble",
        "arch=arm64",
        "pkg=docker-ce ii ",
        "pkg=nvidia-container-toolkit ii ",
        "pkg=curl rc ",
        "daemon_json=" + base64.b64encode(daemon_json.encode()).decode(),
        "docker=enabled active",
        "group=docker:x:988:alice,bob",
        "user=alice",
        "dockerd=/usr/bin/dockerd",
        "nvidia_runtime=/usr/bin/nvidia-container-runtime",
        "nvidia_ctk=/usr/bin/nvidia-ctk",
        "gpu=1",
        "cdi_refresh=enabled active",
    ]
    assert ct_facts.ContainerHost().process(output) == {
        "os": "ubuntu",
        "codename": "noble",
        "arch": "arm64",
        "installed": ["docker-ce", "nvidia-container-toolkit"],  # curl: removed, config left
        "available": [],
        "own_sources": [],
        "daemon_json": daemon_json,
        "docker_enabled": True,
        "docker_active": True,
        "group_members": ["alice", "bob"],
        "users": ["alice"],
        "dockerd": "/usr/bin/dockerd",
        "nvidia_runtime": "/usr/bin/nvidia-container-runtime",
        "nvidia_ctk": "/usr/bin/nvidia-ctk",
        "gpu": True,
        "cdi_refresh": "enabled active",
        "cdi_static_spec": False,
    }


def test_daemon_json_and_group_facts():
    text = '{"data-root": "/srv/docker"}\n'
    encoded = base64.b64encode(text.encode()).decode()
    assert ct_facts.DockerDaemonJson().process([f"daemon_json={encoded}"]) == text
    assert ct_facts.DockerDaemonJson().process([]) is None
    assert ct_facts.GroupMembers().process(["group=docker:x:990:spark", "user=spark"]) == {
        "members": ["spark"],
        "users": ["spark"],
    }
    assert ct_facts.GroupMembers().process(["group="]) == {"members": None, "users": []}


def test_container_host_fact_reads_a_bare_host():
    found = ct_facts.ContainerHost().process(
        ["os=debian", "codename=bookworm", "arch=amd64", "group=", "dockerd=", "nvidia_runtime=", "nvidia_ctk="]
    )
    assert found["daemon_json"] is None and found["group_members"] is None
    assert found["dockerd"] is None and found["nvidia_runtime"] is None and not found["gpu"]


def test_repositories_fact_reads_keys_sources_and_entries():
    found = ct_facts.SparkrigAptRepositories().process(
        [
            "key docker 9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
            "src docker " + "ab" * 32 + " 644",
            "key nvidia-container-toolkit",
            "entry /etc/apt/sources.list.d/docker.list:deb https://download.docker.com/linux/ubuntu noble stable",
        ]
    )
    assert found["docker"] == {
        "fingerprints": ["9DC858229FC7DD38854AE2D88D81803C0EBFCD88"],
        "sources": ["ab" * 32, 0o644],
    }
    assert found["nvidia-container-toolkit"] == {"fingerprints": [], "sources": None}
    assert found["entries"] == [
        ("/etc/apt/sources.list.d/docker.list", "deb https://download.docker.com/linux/ubuntu noble stable")
    ]


# Plans -----------------------------------------------------------------------

HOST_STATE = "dpkg --print-architecture"
REPO_STATE = "--show-keys"
DAEMON_JSON_FACT = "daemon.json); true"
GROUP_FACT = "getent group docker );"
STATUS = "--property SubState"
ENABLED = "--property UnitFileState"
PACKAGES = [
    "docker-ce",
    "docker-ce-cli",
    "containerd.io",
    "docker-buildx-plugin",
    "docker-compose-plugin",
    "nvidia-container-toolkit",
    "ca-certificates",
    "curl",
    "gnupg",
]
MERGED = ct_ops.daemon_json_change(json.dumps(USER_CONFIG), False)


def _host(
    installed=(),
    daemon_json=None,
    keys=True,
    sources=True,
    running=True,
    users=(),
    group="docker:x:990:",
    dockerd=True,
    runtime=True,
    extra_entries=(),
    arch="arm64",
    extra_state=(),
) -> dict:
    state = [
        "os=ubuntu",
        "codename=noble",
        f"arch={arch}",
        f"group={group}",
        *[f"pkg={name} ii " for name in installed],
        f"docker={'enabled active' if running else 'disabled inactive'}",
        *[f"user={u}" for u in users],
    ]
    encoded = [] if daemon_json is None else ["daemon_json=" + base64.b64encode(daemon_json.encode()).decode()]
    state += encoded
    state += [
        f"dockerd={'/usr/bin/dockerd' if dockerd else ''}",
        f"nvidia_runtime={'/usr/bin/nvidia-container-runtime' if runtime else ''}",
        *extra_state,
    ]
    if sources:  # sparkrig's own sources files: "auto" keeps using its repositories
        state += [f"own={name}" for name in ct_facts.REPOSITORY_NAMES]
    repos = []
    for repo in ct_repos.repositories(VENDOR, NOBLE_ARM | {"arch": arch}):
        if keys:
            repos.append(f"key {repo.name} {repo.fingerprint}")
        if sources:
            text = ct_repos.render_sources(repo, arch)
            repos.append(f"src {repo.name} {hashlib.sha256(text.encode()).hexdigest()} 644")
    repos += [f"entry {path}:{line}" for path, line in extra_entries]
    return {
        DAEMON_JSON_FACT: encoded,
        GROUP_FACT: [f"group={group}", *[f"user={u}" for u in users]],
        HOST_STATE: state,
        REPO_STATE: repos,
        "dpkg -l": [f"ii  {name}  1.0  arm64  x" for name in installed],
        STATUS: ["Id=docker.service", f"SubState={'running' if running else 'dead'}"],
        ENABLED: ["Id=docker.service", f"UnitFileState={'enabled' if running else 'disabled'}"],
    }


CONVERGED = _host(installed=PACKAGES, daemon_json=MERGED)


def _commands(ops: list[PlannedOp]) -> dict[str, list[str]]:
    return {op.name.removeprefix("Docker and the NVIDIA container toolkit | "): op.commands for op in ops}


def test_converged_host_gets_no_operations_at_all():
    # Read with two commands (ContainerHost, SparkrigAptRepositories); nothing else to check.
    assert execute(ct.containers, responses=CONVERGED) == []


def test_fresh_ubuntu_host_gets_keys_sources_packages_runtime_and_a_restart():
    # "auto" on a host without Docker or the toolkit, whose sources know neither: the vendors'.
    ops = execute(
        ct.containers, responses=_host(keys=False, sources=False, running=False, dockerd=False, runtime=False)
    )
    commands = _commands(ops)
    assert list(commands) == [
        "Install what fetches and checks repository keys",
        "Signing key of the docker repository (/etc/apt/keyrings/sparkrig-docker.gpg)",
        "Signing key of the nvidia-container-toolkit repository "
        "(/etc/apt/keyrings/sparkrig-nvidia-container-toolkit.gpg)",
        "The docker repository (/etc/apt/sources.list.d/sparkrig-docker.sources)",
        "The nvidia-container-toolkit repository (/etc/apt/sources.list.d/sparkrig-nvidia-container-toolkit.sources)",
        "Install Docker and the NVIDIA container toolkit",
        "Register the nvidia runtime in /etc/docker/daemon.json (other keys kept)",
        "Docker is enabled and running",
        "Restart Docker: /etc/docker/daemon.json changed",
    ]
    tools = commands["Install what fetches and checks repository keys"]
    assert " update && " in tools[0]
    assert tools[0].endswith("install --no-install-recommends ca-certificates curl gnupg")
    key = commands["Signing key of the docker repository (/etc/apt/keyrings/sparkrig-docker.gpg)"]
    assert len(key) == 1 and key[0].startswith("sh -c ")
    assert key[0].endswith(
        " fetch-key https://download.docker.com/linux/ubuntu/gpg "
        "9DC858229FC7DD38854AE2D88D81803C0EBFCD88 /etc/apt/keyrings/sparkrig-docker.gpg"
    )
    install = commands["Install Docker and the NVIDIA container toolkit"]
    assert " update && " in install[0]
    assert install[0].endswith(
        "install --no-install-recommends docker-ce docker-ce-cli containerd.io "
        "docker-buildx-plugin docker-compose-plugin nvidia-container-toolkit"
    )
    upload = next(op.uploads for op in ops if "/etc/docker/.daemon.json.sparkrig-new" in op.uploads)
    assert json.loads(upload["/etc/docker/.daemon.json.sparkrig-new"]) == {
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}
    }
    write = commands["Register the nvidia runtime in /etc/docker/daemon.json (other keys kept)"]
    assert "daemon-json-check /etc/docker/.daemon.json.sparkrig-new" in write[-1]
    # Facts are read again when an operation runs: Docker, started by its package, is then
    # running and gets restarted; this fake host still says "dead", hence a start.
    assert commands["Restart Docker: /etc/docker/daemon.json changed"] == ["systemctl start docker.service"]


def test_installed_host_with_a_user_daemon_json_gets_the_merge_a_backup_and_a_restart():
    original = json.dumps(USER_CONFIG)
    responses = _host(installed=PACKAGES, daemon_json=original)
    responses["sha256sum /etc/docker/daemon.json"] = digest(original)
    ops = execute(ct.containers, responses=responses)
    assert list(_commands(ops)) == [
        "Register the nvidia runtime in /etc/docker/daemon.json (other keys kept)",
        "Restart Docker: /etc/docker/daemon.json changed",
    ]
    write, restart = [op.commands for op in ops]
    assert "&& cp -p /etc/docker/daemon.json /etc/docker/daemon.json.sparkrig-old" in write[-1]
    assert restart == ["systemctl restart docker.service"]
    upload = ops[0].uploads["/etc/docker/.daemon.json.sparkrig-new"]
    assert upload.decode() == MERGED


def test_invalid_daemon_json_is_refused_not_overwritten():
    ops = execute(ct.containers, responses=_host(installed=PACKAGES, daemon_json='{"log-driver": '))
    commands = _commands(ops)
    (refusal,) = commands["Register the nvidia runtime in /etc/docker/daemon.json (other keys kept)"]
    assert refusal.startswith("echo 'sparkrig: /etc/docker/daemon.json: it is not valid JSON")
    assert refusal.endswith("fix or remove it, then run again' >&2; exit 1")
    assert not any(op.uploads for op in ops)


def test_default_runtime_setting_changes_daemon_json_only():
    ops = execute(ct.containers, data={"containers_nvidia_default_runtime": True}, responses=CONVERGED)
    upload = next(op.uploads for op in ops if op.uploads)["/etc/docker/.daemon.json.sparkrig-new"]
    assert json.loads(upload)["default-runtime"] == "nvidia"


def test_a_changed_key_fingerprint_fetches_the_key_and_refreshes_package_lists():
    responses = dict(CONVERGED)
    responses[REPO_STATE] = [
        line.replace("9DC858229FC7DD38854AE2D88D81803C0EBFCD88", "0" * 40) for line in CONVERGED[REPO_STATE]
    ]
    commands = _commands(execute(ct.containers, responses=responses))
    assert list(commands) == [
        "Signing key of the docker repository (/etc/apt/keyrings/sparkrig-docker.gpg)",
        "Install Docker and the NVIDIA container toolkit",
    ]
    install = commands["Install Docker and the NVIDIA container toolkit"]
    assert len(install) == 1 and install[0].endswith(" update")  # nothing missing


def test_a_repository_configured_elsewhere_is_refused_before_any_change():
    entry = (
        "/etc/apt/sources.list.d/docker.list",
        "deb [arch=arm64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/ubuntu noble stable",
    )
    ops = execute(ct.containers, data=VENDOR, responses=_host(keys=False, sources=False, extra_entries=[entry]))
    assert [(op.name, op.commands) for op in ops] == [
        (
            "Docker and the NVIDIA container toolkit | Docker's and NVIDIA's repositories are configured once",
            [
                "echo 'sparkrig: https://download.docker.com/linux/ubuntu is already configured in "
                "/etc/apt/sources.list.d/docker.list; apt refuses one repository with two keyrings: remove that "
                "file, or set the source to '\"'\"'preinstalled'\"'\"' to keep it' >&2; exit 1"
            ],
        )
    ]


def test_preinstalled_without_dockerd_is_refused():
    ops = execute(ct.containers, data={"containers_docker_source": "preinstalled"}, responses=_host(dockerd=False))
    assert [op.name for op in ops] == ["Docker and the NVIDIA container toolkit | Docker is preinstalled"]
    assert "but this host has no dockerd" in ops[0].commands[0]


def test_preinstalled_dgx_os_host_is_only_wired_up():
    ops = execute(
        ct.containers,
        data={
            "containers_docker_source": "preinstalled",
            "containers_toolkit_source": "preinstalled",
            "containers_docker_users": ["spark"],
        },
        responses=_host(daemon_json="{}", users=["spark"], keys=False, sources=False),
    )
    commands = _commands(ops)
    assert list(commands) == [
        "Register the nvidia runtime in /etc/docker/daemon.json (other keys kept)",
        "Restart Docker: /etc/docker/daemon.json changed",
        "containers_docker_users in the docker group (root-equivalent)",
    ]
    assert commands["containers_docker_users in the docker group (root-equivalent)"] == ["gpasswd -a spark docker"]


def test_distro_source_installs_docker_io_and_needs_no_docker_repository():
    data = {"containers_docker_source": "distro"}
    responses = _host(installed=["nvidia-container-toolkit"], daemon_json=MERGED)
    commands = _commands(execute(ct.containers, data=data, responses=responses))
    assert list(commands) == ["Install Docker and the NVIDIA container toolkit", "Docker is enabled and running"]
    # Only what is missing is installed.
    assert commands["Install Docker and the NVIDIA container toolkit"][0].endswith(
        "install --no-install-recommends docker.io"
    )


def test_distro_source_adds_the_separate_docker_client_where_the_distribution_has_one():
    # Debian 13: docker.io leaves the client to docker-cli (a recommendation, not installed).
    responses = _host(installed=["nvidia-container-toolkit"], daemon_json=MERGED, extra_state=["available=docker-cli"])
    commands = _commands(execute(ct.containers, data={"containers_docker_source": "distro"}, responses=responses))
    assert commands["Install Docker and the NVIDIA container toolkit"][0].endswith(
        "install --no-install-recommends docker.io docker-cli"
    )


@pytest.mark.parametrize(
    ("users", "group", "expected"),
    [
        (["spark", "alice"], "docker:x:990:spark", ["gpasswd -a alice docker"]),
        (["spark"], "", ["groupadd --system docker", "gpasswd -a spark docker"]),
    ],
)
def test_docker_group_membership(users, group, expected):
    ops = execute(
        ct.containers,
        data={"containers_docker_users": users},
        responses=_host(installed=PACKAGES, daemon_json=MERGED, users=users, group=group),
    )
    assert [op.commands for op in ops] == [expected]


def test_members_already_in_the_group_cost_nothing():
    assert (
        execute(
            ct.containers,
            data={"containers_docker_users": ["spark"]},
            responses=_host(installed=PACKAGES, daemon_json=MERGED, users=["spark"], group="docker:x:990:spark"),
        )
        == []
    )


def test_a_missing_user_is_refused_not_created():
    ops = execute(
        ct.containers,
        data={"containers_docker_users": ["ghost"]},
        responses=_host(installed=PACKAGES, daemon_json=MERGED),
    )
    assert [op.commands for op in ops] == [
        ["echo 'sparkrig: no such user on this host: ghost (containers_docker_users)' >&2; exit 1"]
    ]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            ["cdi_refresh=disabled inactive", "nvidia_ctk=/usr/bin/nvidia-ctk", "gpu=1"],
            ["systemctl start nvidia-cdi-refresh.path", "systemctl enable nvidia-cdi-refresh.path"],
        ),
        (["cdi_refresh=enabled active", "nvidia_ctk=/usr/bin/nvidia-ctk", "gpu=1"], None),
        (["nvidia_ctk=/usr/bin/nvidia-ctk", "gpu=1"], ["nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"]),
        (["nvidia_ctk=/usr/bin/nvidia-ctk", "gpu=1", "cdi_static_spec=1"], None),
        (["nvidia_ctk=/usr/bin/nvidia-ctk"], None),  # no GPU: nothing to describe
    ],
)
def test_cdi(lines, expected):
    responses = _host(installed=PACKAGES, daemon_json=MERGED, extra_state=lines)
    responses[STATUS] = CONVERGED[STATUS] + ["Id=nvidia-cdi-refresh.path", "SubState=dead"]
    responses[ENABLED] = CONVERGED[ENABLED] + ["Id=nvidia-cdi-refresh.path", "UnitFileState=disabled"]
    ops = execute(ct.containers, responses=responses)
    assert [op.commands for op in ops] == ([] if expected is None else [expected])


# "auto" (the default) -----------------------------------------------------------


def test_auto_keeps_dgx_os_docker_and_toolkit_and_only_wires_them_up():
    """DGX OS: both installed from sources sparkrig did not write; nobody in the group, no
    runtime registered. Nothing is installed, no repository read or written."""
    responses = _host(installed=["docker-ce", "nvidia-container-toolkit"], daemon_json="{}", keys=False, sources=False)
    del responses[REPO_STATE]  # reading sparkrig's repositories would fail the test
    commands = _commands(execute(ct.containers, responses=responses))
    assert list(commands) == [
        "Register the nvidia runtime in /etc/docker/daemon.json (other keys kept)",
        "Restart Docker: /etc/docker/daemon.json changed",
    ]


def test_auto_installs_from_a_source_the_host_already_has():
    # The toolkit is in NVIDIA's CUDA repository the host has: no repository added for it.
    responses = _host(
        installed=PACKAGES[:5],
        daemon_json=MERGED,
        runtime=False,
        keys=False,
        sources=False,
        extra_state=["available=nvidia-container-toolkit"],
    )
    commands = _commands(execute(ct.containers, responses=responses))
    # Docker is checked again after any install (a package may stop or start it).
    assert list(commands) == ["Install Docker and the NVIDIA container toolkit", "Docker is enabled and running"]
    assert commands["Install Docker and the NVIDIA container toolkit"][0].endswith(
        "install --no-install-recommends nvidia-container-toolkit"
    )


@pytest.mark.parametrize(
    "uri",
    [
        "https://download.docker.com/linux/ubuntu",
        "http://download.docker.com/linux/ubuntu/",  # another scheme, a final slash
        "https://download.docker.com/linux/debian",  # the same vendor's other tree
    ],
)
def test_auto_never_adds_a_repository_of_an_origin_the_host_has(uri):
    entry = ("/etc/apt/sources.list.d/docker.list", f"deb [arch=arm64] {uri} noble stable")
    responses = _host(
        daemon_json=MERGED,
        dockerd=False,
        keys=False,
        sources=False,
        extra_entries=[entry],
        installed=["nvidia-container-toolkit"],
    )
    commands = _commands(execute(ct.containers, responses=responses))
    assert not any("repository" in name for name in commands), list(commands)
    assert commands["Install Docker and the NVIDIA container toolkit"][0].endswith(
        "install --no-install-recommends docker-ce docker-ce-cli containerd.io docker-buildx-plugin "
        "docker-compose-plugin"
    )


def test_auto_keeps_the_repository_sparkrig_added_itself():
    # Docker came from sparkrig's repository on an earlier run: its key is still checked.
    responses = dict(CONVERGED)
    responses[REPO_STATE] = [
        line.replace("9DC858229FC7DD38854AE2D88D81803C0EBFCD88", "0" * 40) for line in CONVERGED[REPO_STATE]
    ]
    commands = _commands(execute(ct.containers, responses=responses))
    assert "Signing key of the docker repository (/etc/apt/keyrings/sparkrig-docker.gpg)" in commands


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (
            {"own_sources": [], "dockerd": "/usr/bin/dockerd", "nvidia_runtime": "/usr/bin/x", "available": []},
            ("preinstalled", "preinstalled"),
        ),
        (
            {"own_sources": ["docker"], "dockerd": "/usr/bin/dockerd", "nvidia_runtime": None, "available": []},
            ("docker-ce", "nvidia"),
        ),
        (
            {
                "own_sources": [],
                "dockerd": None,
                "nvidia_runtime": None,
                "available": ["docker-ce", "nvidia-container-toolkit"],
            },
            (ct_repos.HOST_SOURCE, ct_repos.HOST_SOURCE),
        ),
    ],
)
def test_auto_resolves_from_the_host(found, expected):
    resolved = ct_repos.resolve_sources(DEFAULTS, found)
    assert (resolved["containers_docker_source"], resolved["containers_toolkit_source"]) == expected
    # A source named outright is taken as it is.
    assert ct_repos.resolve_sources(VENDOR, found) == {
        "containers_docker_source": "docker-ce",
        "containers_toolkit_source": "nvidia",
    }


@pytest.mark.parametrize(
    ("uri", "same"),
    [
        ("https://download.docker.com/linux/ubuntu", True),
        ("download.docker.com/linux", True),
        ("https://download.docker.com/linuxextra/ubuntu", False),  # not below the origin
        ("https://download.docker.com.evil.example/linux/ubuntu", False),
        ("https://mirror.example/docker/linux/ubuntu", False),
    ],
)
def test_same_origin(uri, same):
    docker, _ = ct_repos.repositories(VENDOR, NOBLE_ARM)
    assert ct_repos.same_origin(uri, docker) is same


def test_container_host_fact_probes_candidates_only_where_the_program_is_missing():
    command = (
        ct_facts.ContainerHost().command(candidates=(("sh", "dpkg"), ("no-such-program-x", "dpkg"))).get_raw_value()
    )
    result = subprocess.run(["dash", "-c", command], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = ct_facts.ContainerHost().process(result.stdout.splitlines())
    if shutil.which("apt-cache"):
        assert found["available"] == ["dpkg"]  # once: `sh` exists, so its probe is skipped
    assert found["own_sources"] == []


@pytest.mark.skipif(not shutil.which("apt-cache"), reason="needs apt-cache (a Debian controller)")
def test_container_host_fact_finds_available_packages_in_one_apt_cache_call():
    command = (
        ct_facts.ContainerHost()
        .command(available=("dpkg", "no-such-package-x"), candidates=(("no-such-program-x", "apt"),))
        .get_raw_value()
    )
    assert command.count("apt-cache") == 1
    result = subprocess.run(["dash", "-c", command], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert ct_facts.ContainerHost().process(result.stdout.splitlines())["available"] == ["dpkg", "apt"]


# A hostile or broken daemon.json --------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"log-driver": "json-file", "labels": ["caf\xe9"]}\n'.encode("latin-1"), "UnicodeDecodeError"),
    ],
)
def test_a_daemon_json_that_is_not_utf8_fails_that_host_not_the_run(content, why):
    output = [f"daemon_json={base64.b64encode(content).decode()}"]
    with pytest.raises(FactProcessError, match=f"DockerDaemonJson: cannot read the host's output \\({why}"):
        ct_facts.DockerDaemonJson().process(output)
    with pytest.raises(FactProcessError, match="ContainerHost: cannot read"):
        ct_facts.ContainerHost().process(output)


def test_a_daemon_json_5000_deep_is_refused_with_a_message():
    text = "[" * 5000 + "]" * 5000
    with pytest.raises(ValueError, match="nests deeper"):
        ct_ops.daemon_json_change(text, True)
    ops = plan(
        lambda: ct_ops.daemon_config(name="daemon.json", default_runtime=True),
        None,
        {"daemon_json": [f"daemon_json={base64.b64encode(text.encode()).decode()}"]},
    )
    (op,) = ops
    assert not op.uploads and "nests deeper" in op.commands[0] and op.commands[0].endswith("exit 1")


def _with_facts_module(module):
    """A module (a concern's package, or sparkrig.atomic), and its facts module where it has one."""
    yield module
    if hasattr(module, "__path__") and importlib.util.find_spec(f"{module.__name__}.facts"):
        yield importlib.import_module(f"{module.__name__}.facts")


def test_every_fact_turns_unparseable_output_into_a_host_failure():
    """Forged output for every fact of operations/: FactProcessError (that host fails, with
    the reason), never another exception."""
    forged = [
        "file x y",
        "## swaps",
        "\udcff\udcfe",
        "unit",
        "token=a b c",
        "stamp lab {",
        "src x 9z",
        "user=a:b:c",
        "key",
        "CudaToolkits",
        "gpu 1 2",
    ]
    checked = set()
    for concern in (
        atomic,
        ca_certificates,
        containers,
        cuda_env,
        hardware,
        jobs,
        ngc,
        python_stack,
        source_builds,
        sshd_guard,
        swap,
    ):
        for module in _with_facts_module(concern):
            for fact in [
                c
                for c in vars(module).values()
                if inspect.isclass(c)
                and issubclass(c, FactBase)
                and c.__module__.startswith(("operations", "sparkrig"))
            ]:
                checked.add(fact.__name__)
                for said in (forged, pyinfra_fake.encode(forged), ["", host_output.END]):
                    try:
                        fact().process(list(said))
                    except FactProcessError:
                        pass
    assert {"ContainerHost", "SparkrigAptRepositories", "CudaToolkits", "ModelCache", "NgcHost"} <= checked
