# shellcheck shell=sh
# How the last boots ended, for sparkrig's updates (the BootHistory fact): the journal's list of
# boots, then for each of the last $1 ended boots only entries whose fields no user can set
# (journald fills the fields that start with _ from the sender's credentials; a user's logger
# gets its own _UID, never 0, and never _PID=1 or _TRANSPORT=kernel), each query bounded by -n
# and printed as JSON lines without MESSAGE; then the kernel's crash dumps (pstore).
# $2: the identifier the rollout's mark is logged with (logger -t, as root); then the pstore
# directories (the kernel's, systemd-pstore's).
count=$1
mark=$2
shift 2
export TZ=UTC LC_ALL=C
echo '## boots'
# Listed once: on a journal of months --list-boots is the slow part.
boots=$(journalctl --list-boots --no-pager -q 2>/dev/null | tail -n "$((count + 1))")
[ -z "$boots" ] || printf '%s\n' "$boots"
for boot in $(printf '%s\n' "$boots" | awk '$1 != 0 { print $2 }'); do
  case $boot in *[!0-9a-f]*) continue ;; esac
  q() { journalctl -b "$boot" -q --no-pager -o json "$@"; }
  echo "## boot $boot"
  echo '# last'
  q -n 1 --output-fields=_BOOT_ID
  echo '# target'
  q -n 4 --output-fields=UNIT,JOB_TYPE,JOB_RESULT _PID=1 _UID=0 \
    UNIT=reboot.target UNIT=poweroff.target UNIT=halt.target UNIT=kexec.target
  echo '# mark'
  q -n 1 --output-fields=SYSLOG_IDENTIFIER _UID=0 SYSLOG_IDENTIFIER="$mark"
  echo '# oom'
  q -n 20 --output-fields=_TRANSPORT _TRANSPORT=kernel --grep='^Out of memory: Killed process' 2>/dev/null
done
echo '## pstore'
[ $# -eq 0 ] || find "$@" -type f -printf '%T@ %P\n' 2>/dev/null | head -n 100
echo '## pstore-unit'
systemctl list-unit-files --no-legend --no-pager --full systemd-pstore.service 2>/dev/null
true
