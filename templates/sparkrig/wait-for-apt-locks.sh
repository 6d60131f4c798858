# shellcheck shell=sh
# Waits until none of apt's and dpkg's locks is held (sparkrig/packages.py), at most $1 seconds,
# then names the holder and fails with 75. $2...: the lock files.
timeout=$1; shift
holder() {
  for lock in "$@"; do
    [ -e "$lock" ] || continue
    inode=$(stat -Lc %i "$lock") || continue
    pid=$(awk -v inode="$inode" '$2 == "->" { next } { n = split($6, dev, ":"); if (dev[n] == inode && $5 > 0) { print $5; exit } }' /proc/locks)
    if [ -n "$pid" ]; then
      echo "$lock is held by process $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo gone))"
      return 0
    fi
  done
  return 1
}
waited=0
while held=$(holder "$@"); do
  if [ "$waited" -ge "$timeout" ]; then
    echo "sparkrig: $held, still after ${timeout} s (packages_dpkg_lock_timeout_s): not installing; run again once it is free (unattended-upgrades holds it for minutes after a boot)" >&2
    exit 75
  fi
  [ $((waited % 30)) -eq 0 ] && echo "sparkrig: waiting for the package manager: $held" >&2
  sleep 1
  waited=$((waited + 1))
done
