"""The lab's apt repositories: indexes, Release files, layout, keys, serving, nft and inventory."""

from __future__ import annotations

import datetime
import functools
import gzip
import hashlib
import http.client
import json
import shutil
import subprocess
import tempfile
import threading
from dataclasses import replace
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from lab import repo
from lab.model import AptRepo, is_lab_repo_server, plan_fleet, repo_url
from lab.render import (
    parse_gpg_fingerprints,
    release_date,
    render_deb822,
    render_inventory,
    render_nft_ruleset,
    render_packages,
    render_packages_entry,
    render_release,
)
from lab.reposerver import _ReadOnlyFiles
from tests.lab import DEFAULT_LAB_ONLY

pytestmark = DEFAULT_LAB_ONLY

HOSTS_DIR = Path("/var/lib/sparkrig-lab/hosts")
REPO_CACHE = Path("/var/cache/sparkrig-lab/repo")
DATE = "Sat, 01 Jun 2024 12:00:00 UTC"
DEBS = {"sparkrig-lab-standin-docker-ce": b"docker deb", repo.TOOLKIT_STANDIN.name: b"toolkit deb"}
DOCKER = "docker/linux/debian"
FLAT = "nvidia/libnvidia-container/stable/deb/amd64"
FLAT_ARM64 = "nvidia/libnvidia-container/stable/deb/arm64"
DGX = "dgx/baseos"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stanza(text: str) -> dict[str, str]:
    """A deb822 stanza's fields (continuation lines joined with newlines)."""
    fields: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith(" "):
            fields[name] += "\n" + line[1:]
        elif line:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields


def _release_sums(text: str) -> dict[str, tuple[str, int]]:
    """``{path: (sha256, size)}`` of a Release file's SHA256 field."""
    sums = _stanza(text)["SHA256"].strip("\n").splitlines()
    return {path: (digest, int(size)) for digest, size, path in (line.split() for line in sums)}


# --- deb822, Packages and Release text ---------------------------------------------


def test_deb822_continuation_lines():
    text = render_deb822({"Package": "p", "Description": "summary\nfirst\n\nsecond"})
    assert text == "Package: p\nDescription: summary\n first\n .\n second\n"


def test_packages_entry_adds_where_and_what_the_deb_is_and_keeps_description_last():
    control = {"Package": "p", "Version": "1.0", "Description": "summary\nlong"}
    deb = b"\x00deb bytes"
    text = render_packages_entry(control, "pool/stable/p_1.0_all.deb", deb)
    order = ["Package", "Version", "Filename", "Size", "SHA256", "Description"]
    assert list(_stanza(text)) == order
    assert _stanza(text) == {
        "Package": "p",
        "Version": "1.0",
        "Filename": "pool/stable/p_1.0_all.deb",
        "Size": str(len(deb)),
        "SHA256": _sha256(deb),
        "Description": "summary\nlong",
    }


def test_packages_index_separates_stanzas_with_a_blank_line():
    assert render_packages(["Package: a\n", "Package: b\n"]) == "Package: a\n\nPackage: b\n"


def test_release_lists_sha256_and_size_of_every_index():
    indexes = {
        "stable/binary-amd64/Packages": b"abc",
        "stable/binary-amd64/Packages.gz": b"\x1f\x8b",
    }
    text = render_release({"Suite": "bookworm", "Date": DATE}, indexes)
    assert text.startswith(f"Suite: bookworm\nDate: {DATE}\nSHA256:\n")
    assert _release_sums(text) == {
        "stable/binary-amd64/Packages": (
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            3,
        ),
        "stable/binary-amd64/Packages.gz": (_sha256(b"\x1f\x8b"), 2),
    }
    assert "MD5Sum" not in text


def test_release_date_is_rfc2822_in_utc():
    paris = datetime.timezone(datetime.timedelta(hours=2))
    assert release_date(datetime.datetime(2024, 6, 1, 14, 0, 5, tzinfo=paris)) == ("Sat, 01 Jun 2024 12:00:05 UTC")


# --- the stand-in packages -----------------------------------------------------------


def test_docker_standin_control():
    control = repo.control_fields(repo.DOCKER_STANDIN)
    assert control["Package"] == "sparkrig-lab-standin-docker-ce"
    assert (control["Version"], control["Architecture"]) == ("1.0", "all")
    assert control["Depends"] == "docker.io, docker-cli | docker.io (<< 26~)"
    assert control["Description"].splitlines()[0] == (
        "sparkrig lab stand-in for Docker's docker-ce (installs Debian's docker.io)"
    )
    assert [file.path for file in repo.DOCKER_STANDIN.files] == ["/usr/share/doc/sparkrig-lab-standin-docker-ce/README"]
    assert "stand-in" in repo.DOCKER_STANDIN.files[0].content


def test_toolkit_standin_control_and_runtime():
    control = repo.control_fields(repo.TOOLKIT_STANDIN)
    assert control["Package"] == "sparkrig-lab-standin-nvidia-container-toolkit"
    assert (control["Version"], control["Architecture"]) == ("1.0", "all")
    assert control["Depends"] == "runc"
    assert control["Description"].splitlines()[0] == (
        "sparkrig lab stand-in for NVIDIA's nvidia-container-toolkit "
        "(a runc pass-through named nvidia-container-runtime)"
    )
    files = {file.path: file for file in repo.TOOLKIT_STANDIN.files}
    runtime = files["/usr/bin/nvidia-container-runtime"]
    assert runtime.mode == 0o755
    lines = runtime.content.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert lines[-1] == 'exec runc "$@"'
    assert any(line.startswith("#") and "stand-in" in line for line in lines[1:])


def test_installed_size_rounds_each_file_up_to_a_kib():
    package = replace(
        repo.DOCKER_STANDIN,
        files=(repo.PackageFile("/a", "x"), repo.PackageFile("/b", "y" * 1025)),
    )
    assert repo.installed_size(package) == 3
    assert repo.control_fields(package)["Installed-Size"] == "3"


# --- the layout ------------------------------------------------------------------------


def test_site_layout_is_docker_and_nvidia_like():
    files = repo.site_files(DEBS, DATE)
    expected = set()
    for flat in (FLAT, FLAT_ARM64, DGX):
        expected |= {f"{flat}/{name}" for name in ("Release", "Packages", "Packages.gz")}
        expected.add(f"{flat}/sparkrig-lab-standin-nvidia-container-toolkit_1.0_all.deb")
    expected.add(f"{DGX}/sparkrig-lab-standin-docker-ce_1.0_all.deb")
    expected.add(f"{DOCKER}/pool/stable/sparkrig-lab-standin-docker-ce_1.0_all.deb")
    for suite in ("bookworm", "trixie"):
        expected.add(f"{DOCKER}/dists/{suite}/Release")
        for arch in ("amd64", "arm64"):
            expected |= {
                f"{DOCKER}/dists/{suite}/stable/binary-{arch}/Packages",
                f"{DOCKER}/dists/{suite}/stable/binary-{arch}/Packages.gz",
            }
    assert set(files) == expected
    assert repo.release_files() == {
        "docker": [f"{DOCKER}/dists/bookworm/Release", f"{DOCKER}/dists/trixie/Release"],
        "nvidia": [f"{FLAT}/Release", f"{FLAT_ARM64}/Release"],
        "dgx": [f"{DGX}/Release"],
    }
    assert repo.PUBLIC_KEYS == {
        "docker": f"{DOCKER}/gpg",
        "nvidia": "nvidia/libnvidia-container/gpgkey",
        "dgx": "dgx/gpgkey",
    }


def test_dgx_os_standin_repository_holds_both_standins_for_every_architecture():
    files = repo.site_files(DEBS, DATE)
    fields = _stanza(files[f"{DGX}/Release"].decode())
    assert fields["Origin"] == repo.DGX_ORIGIN and fields["Architectures"] == "amd64 arm64"
    names = [_stanza(entry)["Package"] for entry in files[f"{DGX}/Packages"].decode().strip().split("\n\n")]
    assert names == ["sparkrig-lab-standin-docker-ce", "sparkrig-lab-standin-nvidia-container-toolkit"]


@pytest.mark.parametrize("suite", ["bookworm", "trixie"])
def test_docker_release_and_packages(suite):
    files = repo.site_files(DEBS, DATE)
    release = files[f"{DOCKER}/dists/{suite}/Release"].decode()
    fields = _stanza(release)
    assert (fields["Suite"], fields["Codename"]) == (suite, suite)
    assert (fields["Components"], fields["Architectures"]) == ("stable", "amd64 arm64")
    assert fields["Date"] == DATE
    sums = _release_sums(release)
    assert set(sums) == {
        f"stable/binary-{arch}/{name}" for arch in ("amd64", "arm64") for name in ("Packages", "Packages.gz")
    }
    for path, (digest, size) in sums.items():
        data = files[f"{DOCKER}/dists/{suite}/{path}"]
        assert (digest, size) == (_sha256(data), len(data))
    binary = f"{DOCKER}/dists/{suite}/stable/binary-amd64"
    packages = files[f"{binary}/Packages"]
    assert gzip.decompress(files[f"{binary}/Packages.gz"]) == packages
    entry = _stanza(packages.decode())
    assert entry["Package"] == "sparkrig-lab-standin-docker-ce"
    assert entry["Filename"] == "pool/stable/sparkrig-lab-standin-docker-ce_1.0_all.deb"
    assert f"{DOCKER}/{entry['Filename']}" in files
    assert (entry["Size"], entry["SHA256"]) == (str(len(b"docker deb")), _sha256(b"docker deb"))


def test_nvidia_flat_release_and_packages():
    files = repo.site_files(DEBS, DATE)
    release = files[f"{FLAT}/Release"].decode()
    fields = _stanza(release)
    assert "Components" not in fields
    assert (fields["Architectures"], fields["Date"]) == ("amd64", DATE)
    sums = _release_sums(release)
    assert set(sums) == {"Packages", "Packages.gz"}
    for path, (digest, size) in sums.items():
        assert (digest, size) == (_sha256(files[f"{FLAT}/{path}"]), len(files[f"{FLAT}/{path}"]))
    entry = _stanza(files[f"{FLAT}/Packages"].decode())
    assert entry["Filename"] == "./sparkrig-lab-standin-nvidia-container-toolkit_1.0_all.deb"
    assert entry["Depends"] == "runc"
    assert (entry["Size"], entry["SHA256"]) == (str(len(b"toolkit deb")), _sha256(b"toolkit deb"))


# --- cache key and keys ------------------------------------------------------------------

FINGERPRINTS = {"docker": "A" * 40, "nvidia": "B" * 40}


def test_repo_key_is_stable_and_follows_keys_recipe_and_packages(monkeypatch):
    base = repo.repo_key(FINGERPRINTS)
    assert base == repo.repo_key(dict(reversed(FINGERPRINTS.items())))
    assert len(base) == 16
    assert repo.repo_key({**FINGERPRINTS, "nvidia": "C" * 40}) != base
    monkeypatch.setattr(repo, "RECIPE_VERSION", repo.RECIPE_VERSION + 1)
    assert repo.repo_key(FINGERPRINTS) != base
    monkeypatch.undo()
    changed = replace(repo.DOCKER_STANDIN, version="1.1")
    monkeypatch.setattr(repo, "STANDINS", (changed, repo.TOOLKIT_STANDIN))
    assert repo.repo_key(FINGERPRINTS) != base


GPG_COLONS = """\
sec:u:255:22:6527E537282D400E:1700000000:::u:::scSC:::+::ed25519:::0:
fpr:::::::::30CB0451DBB97A508FD1CA2C6527E537282D400E:
grp:::::::::0123456789ABCDEF0123456789ABCDEF01234567:
uid:u::::1700000000::HASH1::sparkrig lab docker repository key (stand-in):::::::::0:
sec:u:255:22:ECD11522F7E1D4AA:1700000000:::u:::scSC:::+::ed25519:::0:
fpr:::::::::E7478F2014115D0C030BD8DAECD11522F7E1D4AA:
uid:u::::1700000000::HASH2::a\\x3ab (other):::::::::0:
ssb:u:255:18:1111111111111111:1700000000::::::e:::+::cv25519::
fpr:::::::::1111111111111111111111111111111111111111:
"""


def test_gpg_fingerprints_by_user_id():
    assert parse_gpg_fingerprints(GPG_COLONS) == {
        "sparkrig lab docker repository key (stand-in)": "30CB0451DBB97A508FD1CA2C6527E537282D400E",
        "a:b (other)": "E7478F2014115D0C030BD8DAECD11522F7E1D4AA",
    }


# --- serving -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, ours",
    [
        (
            [
                "/usr/bin/python3",
                "-I",
                "/src/lab/reposerver.py",
                "--root",
                f"{REPO_CACHE}/site-1",
                "--port",
                "8765",
                "10.213.1.1",
            ],
            True,
        ),
        (["python3", "/x/reposerver.py", "--root", f"{REPO_CACHE}/site-1", "10.213.1.1"], True),
        (["python3", "/x/reposerver.py", "--root", "/srv/www", "10.213.1.1"], False),
        (["python3", "/x/other.py", "--root", f"{REPO_CACHE}/site-1"], False),
        (["python3", "-m", "http.server", "--directory", f"{REPO_CACHE}/site-1"], False),
        ([], False),
    ],
)
def test_lab_repo_server_command_lines(argv, ours):
    assert is_lab_repo_server(argv, REPO_CACHE) is ours


def test_repo_url_is_the_gateway_address():
    assert repo_url(1, 8765) == "http://10.213.1.1:8765"
    assert repo_url(254, 80) == "http://10.213.254.1:80"


def test_apt_repo_round_trips_through_state_json():
    apt_repo = AptRepo(REPO_CACHE / "site-1", "A" * 40, "B" * 40, 8765)
    assert AptRepo.from_json(json.loads(json.dumps(apt_repo.to_json()))) == apt_repo


@pytest.fixture
def served(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "file").write_bytes(b"content")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_ReadOnlyFiles, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _request(port: int, method: str, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_server_serves_files_read_only_without_listings(served):
    assert _request(served, "GET", "/dir/file") == (200, b"content")
    assert _request(served, "HEAD", "/dir/file")[0] == 200
    assert _request(served, "GET", "/dir/")[0] == 404
    assert _request(served, "GET", "/missing")[0] == 404
    for method in ("PUT", "POST", "DELETE"):
        assert _request(served, method, "/dir/file")[0] == 501


# --- nft and inventory ---------------------------------------------------------------------


def test_nft_lets_hosts_reach_only_the_repo_port_at_their_own_gateway_before_the_drop():
    rules = [line.strip() for line in render_nft_ruleset(["10.255.255.53"], 0, 9999).splitlines()]
    allow = 'iifname "srlab*" ip daddr 10.213.0.0/16 tcp dport 9999 fib daddr . iif type local accept'
    start, end = rules.index("chain input {"), len(rules)
    assert rules.index(allow) > start
    assert rules.index(allow) < rules.index('iifname "srlab*" drop', start) < end
    assert rules.count(allow) == 1
    assert sum("dport 9999" in rule for rule in rules) == 1


def test_inventory_tells_each_host_its_repo_url_and_the_keys():
    hosts = plan_fleet([(f"h{i}", "debian12") for i in range(1, 4)], HOSTS_DIR)
    apt_repo = AptRepo(REPO_CACHE / "site-1", "A" * 40, "B" * 40, 8765)
    document = json.loads(render_inventory(hosts, Path("/k"), Path("/kh"), apt_repo))
    assert [host["apt_repo_url"] for host in document["hosts"]] == [
        "http://10.213.1.1:8765",
        "http://10.213.2.1:8765",
        "http://10.213.3.1:8765",
    ]
    assert document["apt_repo"] == {
        "docker_key_fingerprint": "A" * 40,
        "nvidia_key_fingerprint": "B" * 40,
        "docker_package": "sparkrig-lab-standin-docker-ce",
        "toolkit_package": "sparkrig-lab-standin-nvidia-container-toolkit",
    }


# --- a real build (gpg and dpkg-deb, no network, no root) --------------------------------


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("gpg", "gpgv", "gpgconf", "dpkg-deb")),
    reason="needs gnupg and dpkg-deb",
)
def test_build_signs_each_repository_with_its_own_key(tmp_path):
    # gpg-agent's socket lives in the home directory, and a Unix socket's path is at most 107
    # bytes: pytest-xdist's tmp_path (popen-gwN/...) is too long for it.
    short = Path(tempfile.mkdtemp(prefix="sr-gpg-", dir="/tmp"))
    try:
        _build_signs_each_repository_with_its_own_key(short / "repo", tmp_path)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _build_signs_each_repository_with_its_own_key(cache: Path, tmp_path: Path):
    built = repo.ensure_repo(cache, 8765)
    assert all(
        len(fpr) == 40 and fpr == fpr.upper() and int(fpr, 16) >= 0
        for fpr in (built.docker_key_fingerprint, built.nvidia_key_fingerprint)
    )
    assert built.docker_key_fingerprint != built.nvidia_key_fingerprint
    site = built.root
    keyrings = {}
    for name, public_key in repo.PUBLIC_KEYS.items():
        keyrings[name] = tmp_path / f"{name}.gpg"
        armored = (site / public_key).read_bytes()
        assert armored.startswith(b"-----BEGIN PGP PUBLIC KEY BLOCK-----")
        dearmor = subprocess.run(["gpg", "--dearmor"], input=armored, capture_output=True, check=True)
        keyrings[name].write_bytes(dearmor.stdout)

    def verifies(keyring: Path, *signed: Path) -> bool:
        result = subprocess.run(["gpgv", "--keyring", keyring, *signed], capture_output=True)
        return result.returncode == 0

    for name, releases in repo.release_files().items():
        other = "nvidia" if name == "docker" else "docker"
        for release in (site / path for path in releases):
            assert verifies(keyrings[name], release.with_name("InRelease"))
            assert verifies(keyrings[name], release.with_name("Release.gpg"), release)
            assert not verifies(keyrings[other], release.with_name("InRelease"))
            assert release.read_text().strip() in release.with_name("InRelease").read_text()

    deb = site / FLAT / "sparkrig-lab-standin-nvidia-container-toolkit_1.0_all.deb"
    contents = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True, check=True)
    runtime = next(line for line in contents.stdout.splitlines() if "container-runtime" in line)
    assert runtime.startswith("-rwxr-xr-x root/root")
    field = subprocess.run(["dpkg-deb", "-f", deb, "Depends"], capture_output=True, text=True)
    assert field.stdout.strip() == "runc"
    packages = _stanza((site / FLAT / "Packages").read_text())
    assert packages["Size"] == str(deb.stat().st_size)
    assert packages["SHA256"] == _sha256(deb.read_bytes())

    # Cached: the same keys and tree, nothing rebuilt; no gpg-agent left behind.
    stamp = (site / FLAT / "InRelease").stat().st_mtime_ns
    assert repo.ensure_repo(cache, 8765) == built
    assert (site / FLAT / "InRelease").stat().st_mtime_ns == stamp
    assert sorted(path.name for path in cache.iterdir()) == ["gnupg", site.name, "tmp"]
    agents = subprocess.run(["pgrep", "-f", f"gpg-agent --homedir {cache}"], capture_output=True)
    assert agents.stdout == b""


def test_dgx_os_standin_repository_offers_the_kernel_and_driver_standins_in_two_versions():
    update_debs = {package.deb_name: package.deb_name.encode() for package in repo.UPDATE_STANDINS}
    files = repo.site_files(DEBS, DATE, update_debs)
    entries = [_stanza(entry) for entry in files[f"{DGX}/Packages"].decode().strip().split("\n\n")]
    versions = {(e["Package"], e["Version"]) for e in entries}
    for name in ("sparkrig-lab-standin-kernel", "sparkrig-lab-standin-nvidia-driver"):
        assert {(name, "1.0"), (name, "2.0")} <= versions
        for version in ("1.0", "2.0"):
            deb = f"{name}_{version}_all.deb"
            assert files[f"{DGX}/{deb}"] == deb.encode()
    # Named as stand-ins in their description too.
    assert all("stand-in" in e["Description"] for e in entries)
