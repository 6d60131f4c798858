"""The lab's pure parts: address plan, rendered files, nft rules, leftover matching, cache key."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from lab import dgxos, image
from lab.cgroups import systemd_hierarchies
from lab.fleet import BOOT_LOOP
from lab.image import Chroot, Systemctl, WriteFile, image_key, recipe_steps
from lab.model import (
    BOOT_MARKER,
    FLAVOURS,
    AptRepo,
    LabHost,
    cluster_links,
    gateway_address,
    host_address,
    is_lab_boot,
    is_lab_link,
    is_lab_netns,
    is_lab_nspawn,
    is_other_lab_netns,
    nspawn_directory,
    parse_fleet_spec,
    plan_fleet,
    veth_name,
)
from lab.render import (
    parse_ip_forward_before,
    parse_nameservers,
    parse_public_key,
    passwd_ids,
    render_daemon_json,
    render_inventory,
    render_known_hosts,
    render_nft_ruleset,
    render_ssh_config,
)
from lab.system import INOTIFY_PER_HOST, inotify_instances, inotify_limit_for, mounts_below
from tests.lab import DEFAULT_LAB_ONLY
from tests.support import REPO

pytestmark = DEFAULT_LAB_ONLY

HOSTS_DIR = Path("/var/lib/sparkrig-lab/hosts")
KEY = Path("/var/lib/sparkrig-lab/ssh/id_ed25519")
KNOWN = Path("/var/lib/sparkrig-lab/known_hosts")
MIRROR = "http://deb.debian.org/debian"


@pytest.fixture
def fleet() -> list[LabHost]:
    return plan_fleet([("lab-deb12", "debian12"), ("lab-deb13", "debian13")], HOSTS_DIR)


# --- address plan ----------------------------------------------------------


def test_fleet_numbers_hosts_from_one_in_order(fleet):
    assert [(h.name, h.address, h.veth, h.netns, h.gateway) for h in fleet] == [
        ("lab-deb12", "10.213.1.2", "srlab1", "sparkrig-lab-deb12", "10.213.1.1"),
        ("lab-deb13", "10.213.2.2", "srlab2", "sparkrig-lab-deb13", "10.213.2.1"),
    ]
    assert fleet[0].rootfs == HOSTS_DIR / "lab-deb12" / "rootfs"
    assert [h.ssh_service for h in fleet] == ["ssh.service", "ssh.socket"]


def test_a_larger_fleet_gets_one_subnet_per_host():
    hosts = plan_fleet([(f"bench{i}", "debian12") for i in range(1, 5)], HOSTS_DIR)
    assert [h.address for h in hosts] == [f"10.213.{i}.2" for i in range(1, 5)]
    assert [h.index for h in hosts] == [1, 2, 3, 4]


@pytest.mark.parametrize("index", [0, 255])
def test_host_numbers_stay_within_one_octet(index):
    for allocate in (host_address, gateway_address, veth_name):
        with pytest.raises(ValueError):
            allocate(index)


def test_veth_names_fit_the_kernel_limit():
    assert len(veth_name(254) + "c") <= 15


@pytest.mark.parametrize(
    "fleet_spec, error",
    [
        ([], "empty"),
        ([("a", "debian12"), ("a", "debian13")], "repeat"),
        ([("Bad_Name", "debian12")], "bad lab host name"),
        ([("-x", "debian12")], "bad lab host name"),
        ([("x", "ubuntu")], "unknown flavour"),
    ],
)
def test_bad_fleets_are_refused(fleet_spec, error):
    with pytest.raises(ValueError, match=error):
        plan_fleet(fleet_spec, HOSTS_DIR)


def test_fleet_spec_of_the_command_line():
    assert parse_fleet_spec("a:debian12, b:debian13") == [("a", "debian12"), ("b", "debian13")]
    with pytest.raises(ValueError):
        parse_fleet_spec("a")


def test_host_round_trips_through_state_json(fleet):
    host = replace(fleet[1], pid=4242)
    assert LabHost.from_json(json.loads(json.dumps(host.to_json()))) == host


# --- rendered files --------------------------------------------------------


def test_ssh_config_has_one_strict_block_per_host(fleet):
    text = render_ssh_config(fleet, KEY, KNOWN)
    assert text.startswith(
        "Host lab-deb12\n"
        "  HostName 10.213.1.2\n"
        "  User spark\n"
        "  IdentityFile /var/lib/sparkrig-lab/ssh/id_ed25519\n"
        "  IdentitiesOnly yes\n"
        "  UserKnownHostsFile /var/lib/sparkrig-lab/known_hosts\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
        "\n"
        "Host lab-deb13\n"
        "  HostName 10.213.2.2\n"
    )
    assert text.count("StrictHostKeyChecking yes") == 2
    assert "StrictHostKeyChecking no" not in text


def test_known_hosts_lists_each_key_by_address_and_by_name(fleet):
    keys = {
        "lab-deb12": [("ssh-ed25519", "AAAA12"), ("ssh-rsa", "BBBB12")],
        "lab-deb13": [("ssh-ed25519", "AAAA13")],
    }
    assert render_known_hosts(fleet, keys).splitlines() == [
        "10.213.1.2 ssh-ed25519 AAAA12",
        "10.213.1.2 ssh-rsa BBBB12",
        "lab-deb12 ssh-ed25519 AAAA12",
        "lab-deb12 ssh-rsa BBBB12",
        "10.213.2.2 ssh-ed25519 AAAA13",
        "lab-deb13 ssh-ed25519 AAAA13",
    ]


def test_public_key_comment_is_dropped():
    assert parse_public_key("ssh-ed25519 AAAAC3Nz root@controller\n") == ("ssh-ed25519", "AAAAC3Nz")
    with pytest.raises(ValueError):
        parse_public_key("garbage")


def test_inventory_json_has_the_documented_fields(fleet):
    apt_repo = AptRepo(Path("/var/cache/sparkrig-lab/repo/site-x"), "D" * 40, "E" * 40, 8765)
    house = {"simple": "/wheels/simple", "torch": [], "vllm_standin": {"name": "x"}}
    registry = {"name": "sparkrig-lab/ngc-stand-in", "tag": "stand-in", "digest": "sha256:" + "f" * 64}
    sources = {"name": "sparkrig-lab-ext", "path": "/sources/sparkrig-lab-ext.git", "refs": {}}
    document = json.loads(render_inventory(fleet, KEY, KNOWN, apt_repo, house, registry, sources))
    assert document == {
        "hosts": [
            {
                "name": "lab-deb12",
                "flavour": "debian12",
                "address": "10.213.1.2",
                "ssh_user": "spark",
                "ssh_key": "/var/lib/sparkrig-lab/ssh/id_ed25519",
                "known_hosts": "/var/lib/sparkrig-lab/known_hosts",
                "ssh_service": "ssh.service",
                "apt_repo_url": "http://10.213.1.1:8765",
            },
            {
                "name": "lab-deb13",
                "flavour": "debian13",
                "address": "10.213.2.2",
                "ssh_user": "spark",
                "ssh_key": "/var/lib/sparkrig-lab/ssh/id_ed25519",
                "known_hosts": "/var/lib/sparkrig-lab/known_hosts",
                "ssh_service": "ssh.socket",
                "apt_repo_url": "http://10.213.2.1:8765",
            },
        ],
        "apt_repo": {
            "docker_key_fingerprint": "D" * 40,
            "nvidia_key_fingerprint": "E" * 40,
            "docker_package": "sparkrig-lab-standin-docker-ce",
            "toolkit_package": "sparkrig-lab-standin-nvidia-container-toolkit",
        },
        "wheelhouse": house,
        "registry": registry,
        "sources": sources,
        # lab-deb12 and lab-deb13 are cabled by the ConnectX-7 stand-in.
        "clusters": [
            {
                "name": "lab",
                "interface": "cx7-standin",
                "addresses": {"lab-deb12": "192.168.100.11/24", "lab-deb13": "192.168.100.12/24"},
            }
        ],
    }


def test_the_cluster_link_needs_both_of_its_hosts():
    assert [link.hosts for link in cluster_links(["lab-deb12", "lab-deb13", "lab-gb10"])] == [
        ("lab-deb12", "lab-deb13")
    ]
    assert cluster_links(["lab-deb12", "lab-deb13-b"]) == []


def test_nameservers_usable_by_the_hosts():
    resolv = (
        "# comment\nsearch example\nnameserver 10.255.255.53\nnameserver 127.0.0.53\n"
        "nameserver ::1\nnameserver 2001:db8::1\nnameserver nonsense\nnameserver 1.1.1.1\n"
    )
    assert parse_nameservers(resolv) == ["10.255.255.53", "1.1.1.1"]


def test_passwd_ids():
    passwd = "root:x:0:0:root:/root:/bin/bash\nspark:x:1000:1000::/home/spark:/bin/bash\n"
    assert passwd_ids(passwd, "spark") == (1000, 1000)
    with pytest.raises(ValueError):
        passwd_ids(passwd, "nobody")


# --- nftables --------------------------------------------------------------


def _rules(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def test_nft_ruleset_is_one_table_with_nat_forward_and_input():
    text = render_nft_ruleset(["10.255.255.53"], 0)
    assert text.startswith("table inet sparkrig_lab {")
    assert text.count("table ") == 1
    assert "flush" not in text
    rules = _rules(text)
    assert 'ip saddr 10.213.0.0/16 oifname != "srlab*" masquerade' in rules
    assert "type nat hook postrouting priority srcnat; policy accept;" in rules
    assert rules.count("type filter hook forward priority filter; policy accept;") == 1
    assert rules.count("type filter hook input priority filter; policy accept;") == 1


def test_nft_forward_isolates_hosts_but_lets_dns_through_first():
    rules = _rules(render_nft_ruleset(["10.255.255.53", "192.168.1.1"], 0))
    dns_udp = 'iifname "srlab*" ip daddr { 10.255.255.53, 192.168.1.1 } udp dport 53 accept'
    dns_tcp = dns_udp.replace("udp", "tcp")
    private = (
        'iifname "srlab*" ip daddr { 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16, 100.64.0.0/10 } drop'
    )
    order = [
        "ct state established,related accept",
        'iifname "srlab*" oifname "srlab*" tcp dport 9100 accept',
        'iifname "srlab*" oifname "srlab*" drop',
        dns_udp,
        dns_tcp,
        private,
        'iifname "srlab*" accept',
    ]
    assert [rules.index(rule) for rule in order] == sorted(rules.index(rule) for rule in order)


def test_nft_lets_hosts_reach_each_other_on_the_node_exporters_port_alone():
    """The fleet's Prometheus on one lab host scrapes the others (inventory/lab.py)."""
    rules = _rules(render_nft_ruleset(["10.255.255.53"], 0))
    between = [rule for rule in rules if 'oifname "srlab*"' in rule and "!=" not in rule]
    assert between == [
        'iifname "srlab*" oifname "srlab*" tcp dport 9100 accept',
        'iifname "srlab*" oifname "srlab*" drop',
    ]


def test_nft_input_only_lets_replies_and_the_apt_repository_in_from_the_hosts():
    rules = _rules(render_nft_ruleset(["10.255.255.53"], 0, 8765))
    start = rules.index("chain input {")
    assert rules[start + 2 : start + 5] == [
        'iifname "srlab*" ct state established,related accept',
        'iifname "srlab*" ip daddr 10.213.0.0/16 tcp dport 8765 fib daddr . iif type local accept',
        'iifname "srlab*" drop',
    ]


@pytest.mark.parametrize("before", [0, 1])
def test_nft_table_comment_records_ip_forward(before):
    assert parse_ip_forward_before(render_nft_ruleset(["10.255.255.53"], before)) == before
    assert parse_ip_forward_before("table inet sparkrig_lab {\n}") is None


def test_nft_ruleset_needs_a_nameserver():
    with pytest.raises(ValueError):
        render_nft_ruleset([], 0)


# --- leftovers -------------------------------------------------------------


@pytest.mark.parametrize(
    "name, ours",
    [("sparkrig-lab-deb12", True), ("sparkrig-x", True), ("sparkrig-", False), ("docker", False)],
)
def test_lab_netns_names(name, ours):
    assert is_lab_netns(name) is ours


@pytest.mark.parametrize(
    "name, other",
    [
        ("sparkrig7-lab-a", True),
        ("sparkrig-lab-deb12", False),
        ("sparkrig7-", False),
        ("sparkrigx-a", False),
        ("docker", False),
    ],
)
def test_other_labs_netns_names(name, other):
    """This module's lab is the default one (no SPARKRIG_LAB_ID in the unit run)."""
    assert is_other_lab_netns(name) is other


@pytest.mark.parametrize(
    "name, ours",
    [
        ("srlab1", True),
        ("srlab254", True),
        ("srlab3c", True),
        ("srlab2@if9", True),
        ("srlab", False),
        ("srlabx", False),
        ("eth0", False),
        ("xsrlab1", False),
    ],
)
def test_lab_link_names(name, ours):
    assert is_lab_link(name) is ours


def _nspawn(directory_args: list[str]) -> list[str]:
    return ["systemd-nspawn", "--boot", *directory_args, "--machine=x", "--console=read-only"]


@pytest.mark.parametrize(
    "argv, ours",
    [
        (_nspawn(["-D", "/var/lib/sparkrig-lab/hosts/lab-deb12/rootfs"]), True),
        (_nspawn(["--directory=/var/lib/sparkrig-lab/hosts/a/rootfs"]), True),
        (_nspawn(["-D/var/lib/sparkrig-lab/hosts/a/rootfs"]), True),
        (["/usr/bin/systemd-nspawn", "-D", "/var/lib/sparkrig-lab/hosts/b/rootfs"], True),
        (_nspawn(["-D", "/var/lib/machines/other"]), False),
        (_nspawn(["-D", "/var/lib/sparkrig-lab/hosts-other/a"]), False),
        (["vim", "-D", "/var/lib/sparkrig-lab/hosts/a/rootfs"], False),
        ([], False),
    ],
)
def test_lab_nspawn_command_lines(argv, ours):
    assert is_lab_nspawn(argv, HOSTS_DIR) is ours


def test_a_boot_loop_is_known_by_its_marker_and_its_lab_nspawn():
    nspawn = _nspawn(["-D", "/var/lib/sparkrig-lab/hosts/a/rootfs"])
    assert is_lab_boot(["sh", "-c", "LOOP", BOOT_MARKER, "/cg/cgroup.procs", "--", *nspawn], HOSTS_DIR)
    assert not is_lab_boot(["sh", "-c", "LOOP", "other", "--", *nspawn], HOSTS_DIR)
    assert not is_lab_boot(["sh", "-c", "LOOP", BOOT_MARKER, "--", *_nspawn(["-D", "/var/lib/machines/x"])], HOSTS_DIR)
    assert not is_lab_boot(nspawn, HOSTS_DIR) and not is_lab_nspawn(
        ["sh", "-c", "LOOP", BOOT_MARKER, "--", *nspawn], HOSTS_DIR
    )


def _boot_loop(tmp_path: Path, statuses: list[int]) -> subprocess.CompletedProcess:
    """lab/fleet.py's boot loop around a STAND-IN for systemd-nspawn that exits with each of
    ``statuses`` in turn (a real nspawn exits 133 when its container asks for a reboot)."""
    procs = tmp_path / "cgroup.procs"
    stand_in = tmp_path / "nspawn-stand-in"
    stand_in.write_text(
        "#!/bin/sh\nset -- "
        + " ".join(map(str, statuses))
        + '\nn=$(wc -l < "$0.runs" 2>/dev/null || echo 0); shift "$n"; echo run >> "$0.runs"; exit "$1"\n'
    )
    stand_in.chmod(0o755)
    return subprocess.run(
        ["sh", "-c", BOOT_LOOP, BOOT_MARKER, str(procs), "--", str(stand_in)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_boot_loop_boots_again_after_a_reboot_and_ends_on_any_other_exit(tmp_path):
    result = _boot_loop(tmp_path, [133, 133, 0])
    assert result.returncode == 0
    assert (tmp_path / "nspawn-stand-in.runs").read_text().count("run") == 3
    assert result.stdout.count("booting again") == 2
    # Each boot joins the host's cgroups (here a file standing in for cgroup.procs) first.
    assert (tmp_path / "cgroup.procs").read_text().strip().isdigit()


def test_the_boot_loop_passes_a_failure_on_without_booting_again(tmp_path):
    result = _boot_loop(tmp_path, [1, 0])
    assert result.returncode == 1
    assert (tmp_path / "nspawn-stand-in.runs").read_text().count("run") == 1


def test_nspawn_directory():
    assert nspawn_directory(_nspawn(["-D", "/a/rootfs"])) == "/a/rootfs"
    assert nspawn_directory(["systemd-nspawn", "--boot"]) is None


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
42 27 254:0 /run/netns /run/netns rw,relatime shared:1 - ext4 /dev/vda rw
50 22 0:50 / /var/cache/sparkrig-lab/tmp/x/rootfs/proc rw - proc proc rw
51 22 0:51 / /var/cache/sparkrig-lab/tmp/x/rootfs/sys rw - sysfs sysfs rw
52 51 0:52 / /var/cache/sparkrig-lab/tmp/x/rootfs/sys/fs/cgroup rw - cgroup2 cgroup2 rw
53 22 0:53 / /var/cache/sparkrig-lab/tmp/x\\040y rw - tmpfs tmpfs rw
54 22 0:54 / /var/cache/sparkrig-lab/tmp/xy rw - tmpfs tmpfs rw
"""


def test_mounts_below_a_tree_deepest_first():
    assert mounts_below(MOUNTINFO, Path("/var/cache/sparkrig-lab/tmp/x")) == [
        "/var/cache/sparkrig-lab/tmp/x/rootfs/sys/fs/cgroup",
        "/var/cache/sparkrig-lab/tmp/x/rootfs/sys",
        "/var/cache/sparkrig-lab/tmp/x/rootfs/proc",
    ]
    assert mounts_below(MOUNTINFO, Path("/var/cache/sparkrig-lab/tmp/x y")) == ["/var/cache/sparkrig-lab/tmp/x y"]
    assert mounts_below(MOUNTINFO, Path("/var/lib/sparkrig-lab")) == []


def test_cgroup_hierarchies_systemd_uses():
    mountinfo = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
    assert systemd_hierarchies(mountinfo) == [
        Path("/sys/fs/cgroup/systemd"),
        Path("/sys/fs/cgroup/unified"),
    ]
    unified = "30 23 0:27 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    assert systemd_hierarchies(unified) == [Path("/sys/fs/cgroup")]


# --- image cache key -------------------------------------------------------


def _key(flavour="debian12", mirror=MIRROR, steps=None):
    flavour_ = FLAVOURS[flavour]
    steps = recipe_steps(flavour_, mirror) if steps is None else steps
    return image_key(flavour_, mirror, steps)


def test_image_key_is_stable():
    assert _key() == _key()
    assert len(_key()) == 16


def test_image_key_changes_with_suite_and_mirror():
    keys = {_key(), _key(flavour="debian13"), _key(mirror="http://mirror.example/debian")}
    assert len(keys) == 3


def test_image_key_changes_with_any_recipe_step():
    steps = recipe_steps(FLAVOURS["debian12"], MIRROR)
    assert _key(steps=steps + (Chroot(("true",)),)) != _key()
    assert _key(steps=steps[1:]) != _key()


def test_image_key_changes_with_recipe_version_and_packages(monkeypatch):
    base = _key()
    monkeypatch.setattr(image, "RECIPE_VERSION", image.RECIPE_VERSION + 1)
    assert _key() != base
    monkeypatch.undo()
    monkeypatch.setattr(image, "PACKAGES", image.PACKAGES + ("curl",))
    assert _key() != base


def test_recipe_steps_per_flavour():
    bookworm = recipe_steps(FLAVOURS["debian12"], MIRROR)
    trixie = recipe_steps(FLAVOURS["debian13"], MIRROR)
    assert Systemctl(("mask", "systemd-modules-load.service")) in bookworm
    assert Systemctl(("enable", "ssh.socket")) in trixie
    assert Systemctl(("disable", "ssh.service")) in trixie
    assert not any(isinstance(s, Systemctl) and "ssh.socket" in s.argv for s in bookworm)
    # The controller's CA certificates reach hosts through the deploy, never the image.
    assert not any(isinstance(s, WriteFile) and "ca-certificates" in s.path for s in bookworm)
    sudoers = next(s for s in bookworm if isinstance(s, WriteFile) and "sudoers" in s.path)
    assert (sudoers.path, sudoers.mode) == ("/etc/sudoers.d/spark", 0o440)
    sources = next(s for s in trixie if isinstance(s, WriteFile) and s.path == "/etc/apt/sources.list")
    assert f"deb {MIRROR} trixie main" in sources.content


def test_the_dgx_os_network_stack_flavour_never_runs_udev_and_keeps_networkd_off():
    """A lab host's /sys is the controller's and writable: udev there would act on the
    controller's devices. DGX OS's networkd is installed, not running."""
    steps = recipe_steps(FLAVOURS["debian13-nm"], MIRROR)
    assert Systemctl(("mask", *image.UDEV_UNITS)) in steps
    assert {"systemd-udevd.service", "systemd-udev-trigger.service"} <= set(image.UDEV_UNITS)
    assert Systemctl(("disable", *image.NETWORKD_UNITS)) in steps
    assert {"netplan.io", "network-manager"} <= set(FLAVOURS["debian13-nm"].extra_packages)
    assert not any(
        isinstance(s, Systemctl) and "systemd-udevd.service" in s.argv
        for s in recipe_steps(FLAVOURS["debian13"], MIRROR)
    )


def test_the_dgx_os_network_stack_puts_eth0_on_networkmanager_through_netplan():
    files = dgxos.network_files(FLAVOURS["debian13-nm"], "10.213.2.2", "10.213.2.1", ["10.0.0.53"])
    netplan, mode = files[dgxos.NETPLAN_FILE]
    assert mode == 0o600 and "  renderer: NetworkManager\n" in netplan
    assert "addresses: [10.213.2.2/24]" in netplan and "via: 10.213.2.1" in netplan and "[10.0.0.53]" in netplan
    assert "BindReadOnlyPaths=/sys" in files[dgxos.NM_LAB_DROP_IN][0]  # the STAND-IN for udev
    assert dgxos.network_files(FLAVOURS["debian13"], "10.213.2.2", "10.213.2.1", ["10.0.0.53"]) == {}


# --- SPARKRIG_LAB_ID: a second lab beside the default one --------------------------


def _lab_names(lab_id: str) -> subprocess.CompletedProcess[str]:
    code = (
        "from lab import config as c; print(c.LAB_DIR, c.REPO_CACHE.name, c.NETNS_PREFIX, "
        "c.VETH_PREFIX, c.NFT_TABLE, c.SUBNET_PREFIX, c.CGROUP_PARENT)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRIG_LAB")}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "SPARKRIG_LAB_ID": lab_id},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
    )


def test_default_lab_keeps_its_names():
    out = _lab_names("").stdout.split()
    assert out == ["/var/lib/sparkrig-lab", "repo", "sparkrig-", "srlab", "sparkrig_lab", "10.213", "sparkrig-lab"]


def test_a_lab_id_gives_names_no_default_lab_pattern_matches():
    out = _lab_names("3").stdout.split()
    assert out == [
        "/var/lib/sparkrig-lab-3",
        "repo-3",
        "sparkrig3-",
        "sr3lab",
        "sparkrig_lab3",
        "10.216",
        "sparkrig-lab3",
    ]
    default_link, default_netns = re.compile(r"^srlab\d+c?$"), "sparkrig-"
    assert not default_link.match("sr3lab1") and not default_link.match("sr3lab1c")
    assert not "sparkrig3-lab-deb12".startswith(default_netns)


@pytest.mark.parametrize("bad", ["0", "10", "a", "-1"])
def test_a_bad_lab_id_is_refused(bad):
    result = _lab_names(bad)
    assert result.returncode != 0 and "SPARKRIG_LAB_ID must be one digit 1-9" in result.stderr


def test_every_lab_host_starts_trusting_the_labs_registry_at_its_own_gateway():
    """Without it a lab brought up by hand (README: up, then deploy) cannot pull the NGC
    stand-in image by digest from the lab's plain-HTTP registry."""
    (host,) = plan_fleet([("lab-deb13", "debian13")], HOSTS_DIR)
    assert json.loads(render_daemon_json(host, 8765)) == {"insecure-registries": ["10.213.1.1:8765"]}


def test_the_command_lines_help_is_plain_text():
    result = subprocess.run(
        [sys.executable, "-m", "lab", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "``" not in result.stdout and ":mod:" not in result.stdout and ":data:" not in result.stdout
    assert result.stdout.startswith("usage: python -m lab ") and "systemd-nspawn" in result.stdout


def test_the_lab_raises_roots_inotify_limit_only_where_its_hosts_would_run_out():
    assert inotify_limit_for(128, 40, 5) is None  # 40 + 80 fit in 128
    assert inotify_limit_for(128, 120, 5) == 256  # 200 do not
    assert inotify_limit_for(1024, 800, 8) is None
    assert inotify_limit_for(128, 128 - INOTIFY_PER_HOST, 1) is None
    assert inotify_instances() >= 0


def test_a_second_lab_never_removes_an_image_build_in_progress(tmp_path):
    """Two labs (SPARKRIG_LAB_ID) share the image cache: the second one's start used to remove
    the first one's debootstrap tree mid-build as an "unfinished build" (its /proc unmounted,
    the build failed). While another process holds the cache, a start waits, then clears."""
    leftover = tmp_path / "tmp" / "debian12-arm64-0123.abcd"
    leftover.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()",
            str(tmp_path / "build.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        starting = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from lab import image; "
                "image.ensure_images([], Path(sys.argv[1]), 'http://mirror.invalid', Path(sys.argv[1]) / 'hosts')",
                str(tmp_path),
            ],
            cwd=Path(__file__).resolve().parents[2],
        )
        with pytest.raises(subprocess.TimeoutExpired):
            starting.wait(timeout=2)
        assert leftover.is_dir(), "a start removed the build another lab is running"
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    assert starting.wait(timeout=30) == 0
    assert not leftover.exists(), "the unfinished build of a lab that ended stays"
