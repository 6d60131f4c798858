# shellcheck shell=sh
# Checks a drop-in the way systemd will read it, before it takes effect: the unit's own
# file and the new drop-in in a scratch directory, `systemd-analyze verify` on it, and
# any diagnostic about the drop-in (unknown key, bad value: which systemd only warns
# about and ignores) rejects it. Run as root by sparkrig's sshd_guard.
# $1: the unit (ssh.service, system.slice), $2: the new drop-in.
unit=$1 new=$2
command -v systemd-analyze >/dev/null || exit 0
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
fragment=$(systemctl show -P FragmentPath "$unit")
if [ -n "$fragment" ]; then cp "$fragment" "$dir/$unit"; else printf '[Unit]\n' >"$dir/$unit"; fi
mkdir "$dir/$unit.d" && cp "$new" "$dir/$unit.d/sparkrig.conf" || exit 1
out=$(systemd-analyze verify --man=no "$dir/$unit" 2>&1); rc=$?
if [ $rc -ne 0 ] || printf '%s\n' "$out" | grep -q "$unit.d/sparkrig.conf"; then
    printf 'sparkrig: systemd-analyze verify rejects the %s drop-in:\n%s\n' "$unit" "$out" >&2
    exit 1
fi
