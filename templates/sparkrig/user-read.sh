# shellcheck shell=sh
# Prints the file $1, an absolute path a user controls, at most $2 bytes: the one reader
# (sparkrig/user_files.py, which starts it under timeout: all of it, the walk and stat too).
# No link in any component: it enters $1's directory (cd -P) and goes on only if that
# directory's real path is the one written; from there it opens the file by its name alone,
# never through the path again (a directory swapped for a link after the check is not
# followed: the reader already stands in the real one). A regular file only (a FIFO,
# device, directory or link reads as missing), opened without following a link and
# without blocking (dd's nofollow, nonblock: a FIFO swapped in after the check still never
# blocks). Exit status: 0 read, 1 missing, not a regular file or a link on the way, 2 too
# large (timeout's 124: timed out).
case $1 in /*) ;; *) echo "sparkrig: $1 is not an absolute path: not read" >&2; exit 1;; esac
d=${1%/*}
cd -P -- "${d:-/}" 2>/dev/null || exit 1
[ "$(pwd -P)" = "${d:-/}" ] || { echo "sparkrig: $1 has a link on its way: read as missing" >&2; exit 1; }
f=./${1##*/}
s=$(stat -c "%F %s" -- "$f" 2>/dev/null) || exit 1
case "$s" in
    "regular file "*|"regular empty file "*) ;;
    *) echo "sparkrig: $1 is not a regular file (${s% *}): read as missing" >&2; exit 1;;
esac
[ "${s##* }" -le "$2" ] || { echo "sparkrig: $1 is over $2 bytes: not read" >&2; exit 2; }
exec dd if="$f" iflag=nofollow,nonblock,count_bytes count="$2" bs=65536 status=none
