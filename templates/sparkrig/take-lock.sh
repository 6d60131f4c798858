# shellcheck shell=sh
# Takes this host's deploy lock (sparkrig/lock.py), as root: $1 the lock file, $2 seconds to wait.
lock=$1
fail() { printf 'sparkrig: %s\n' "$*" >&2; exit 1; }
if [ -L "$lock" ] || { [ -e "$lock" ] && [ ! -f "$lock" ]; }; then
  fail "$lock is not a regular file: refusing to lock through it"
fi
umask 077
exec 9>>"$lock" || fail "cannot open $lock"
[ "$(stat -L -c '%u %a %h' /proc/self/fd/9)" = "$(id -u) 600 1" ] \
  || fail "$lock is not $(id -un)'s with mode 600 and one link: refusing it"
if ! flock -w "$2" 9; then
  fail "another deploy is changing this host: $(head -c 400 "$lock" | tr -cd '[:print:]');" \
    "this run leaves the host alone (the lock, $lock, is released when that run's SSH connection ends)"
fi
: > /proc/self/fd/9
# /proc/PID/stat as positional parameters numbered like its fields (comm may hold spaces).
p=$$ below='' watch='' fallback='' from=''
while [ "$p" -gt 1 ]; do
  if ! comm=$(cat "/proc/$p/comm") || ! s=$(cat "/proc/$p/stat"); then fail "cannot read /proc/$p"; fi
  case $comm in
    sshd|sshd-session) watch=$p; break ;;
    sh|dash|bash|sudo) ;;
    *) fallback=${fallback:-$p} ;;
  esac
  below=$p
  # The fields after comm, split into words on purpose.
  # shellcheck disable=SC2086
  set -- "$p" "$comm" ${s##*) }
  p=$4
done
if [ -n "$watch" ]; then
  from=$(tr '\0' '\n' < "/proc/$below/environ" | sed -n 's/^SSH_CONNECTION=\([^ ]*\) \([^ ]*\) .*/\1 port \2/p')
else
  watch=$fallback
fi
[ -n "$watch" ] || fail "no process of this run to tie the lock to"
s=$(cat "/proc/$watch/stat") || fail "cannot read /proc/$watch"
# shellcheck disable=SC2086
set -- "$watch" "" ${s##*) }
since=${22}
# The holder's own script: its $1 and $2 are its arguments, expanded there.
# shellcheck disable=SC2016
setsid sh -c 'while s=$(cat "/proc/$1/stat" 2>/dev/null); do
  set -- "$1" "$2" ${s##*) }; [ "${22}" = "$2" ] || exit 0; sleep 1; done' \
  sh "$watch" "$since" </dev/null >/dev/null 2>&1 &
printf '%s from %s (%s pid %s), since %s; lock holder pid %s\n' "$(stat -c %U "/proc/$watch")" \
  "${from:-this machine}" "$(cat "/proc/$watch/comm")" "$watch" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$!" >&9
