# shellcheck shell=sh
# {% raw %} (this is jinja's: the script holds ${#...}, which jinja would take for a comment)
# Runs the parts of one reading side by side and prints what each did, once all have ended
# (sparkrig/parts.py writes the variables before it and reads what it prints).
# Set before: n parts and c0.. their commands; units (how many), each m0.. (its parts' numbers, run one
# after another by one shell: what a part costs to start, a timeout and a shell, paid once
# for several cheap ones) and t0.. (its time limit, seconds); lanes (how many units run at
# once); blocks (the most a part may write to any file, in 512-byte blocks: a
# bound on the disk, above what apt writes to its cache); cap (each output's bytes at most:
# a larger one is not sent, its status says "big"); reading_s (no part starts after this
# many seconds); total (the reading's bytes at most); sh (the shell that runs a part).
# No part can forge or block another's answer: each runs with stdin from /dev/null, its
# stdout and stderr into files of a fresh directory only this user may enter, descriptors
# 3 to 9 closed (sparkrig's shell opens none above 2, and refuses to start with one open
# above 9, which sh cannot close), in a process group of its own (timeout's) that is killed
# once it ended, under timeout and a file-size limit. This shell alone prints, after every
# part ended: each part's status and output lengths, then every output in one base64 line,
# so no tag or secret is needed.
# shellcheck disable=SC2154
umask 077
cd / || exit 1
for f in "/proc/$$/fd"/*; do
  case ${f##*/} in
    [0-9]) ;;
    *) [ -e "$f" ] && { echo "sparkrig: the reading inherited descriptor ${f##*/}: refused" >&2; exit 3; } ;;
  esac
done
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
read -r up _ </proc/uptime
end=$((${up%.*} + reading_s))
run() {
  eval "m=\$m$1; t=\$t$1"
  # The reading's time is spent: this unit does not start (its answers say so).
  read -r up _ </proc/uptime
  if [ "${up%.*}" -ge "$end" ]; then
    for i in $m; do echo late >"$d/$i.s"; done
    return
  fi
  case $m in
    *" "*)
      # Several parts: one shell (its stdin /dev/null) runs each in a subshell of its own,
      # its outputs and status its own (an empty status: started, not ended). The shell
      # takes the parts' commands as arguments, never as text of its own.
      set -- "$d"
      for i in $m; do eval "set -- \"\$@\" $i \"\$c$i\""; done
      timeout -k 2 "$t" "$sh" -c "$unit" sh "$@" </dev/null >/dev/null 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
      ;;
    *)
      eval "c=\$c$m"
      timeout -k 2 "$t" "$sh" -c "$c" </dev/null >"$d/$m.o" 2>"$d/$m.e" 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
      ;;
  esac
  p=$!
  wait "$p"
  s=$?
  # What the unit left in its process group (timeout's, which set it up) ends with it.
  kill -s KILL -- "-$p" 2>/dev/null
  case $m in
    *" "*)
      for i in $m; do
        # A part the unit's end cut short has the unit's status (its time limit's); one it
        # never reached did not run.
        if [ ! -e "$d/$i.s" ]; then
          echo cut >"$d/$i.s"
        elif [ ! -s "$d/$i.s" ]; then
          echo "$s" >"$d/$i.s"
        fi
      done
      ;;
    *) echo "$s" >"$d/$m.s" ;;
  esac
}
# shellcheck disable=SC2016 # the unit's own text, expanded by the unit's shell
unit='d=$1
shift
while [ "$#" -gt 1 ]; do
  : >"$d/$1.s"
  (eval "$2") >"$d/$1.o" 2>"$d/$1.e"
  echo "$?" >"$d/$1.s"
  shift 2
done'
k=0
l=
while [ "$k" -lt "$lanes" ] && [ "$k" -lt "$units" ]; do
  (
    ulimit -f "$blocks"
    j=$k
    while [ "$j" -lt "$units" ]; do
      run "$j"
      j=$((j + lanes))
    done
  ) </dev/null >/dev/null 2>&1 &
  l="$l $!"
  k=$((k + 1))
done
# shellcheck disable=SC2086
wait $l
# A process that left its group (setsid, a double fork) still holding a part's file is
# killed too, before the files are read: nothing writes them after this point. The list of
# processes is taken before find looks, so one forked meanwhile is caught by a later round:
# the rounds end after two in a row found nobody.
r=0
z=0
while [ "$r" -lt 10 ] && [ "$z" -lt 2 ]; do
  q=$(find /proc/[0-9]*/fd -maxdepth 1 -lname "$d/*" 2>/dev/null | cut -d/ -f3 | sort -u)
  if [ -n "$q" ]; then
    z=0
    # shellcheck disable=SC2086
    kill -s KILL $q 2>/dev/null
  else
    z=$((z + 1))
  fi
  r=$((r + 1))
done
# One stat for every output's size, one base64 for all of them (two programs, not two a part:
# on an emulated host each program costs tens of milliseconds): the answers' bytes are the
# outputs in order, each part's line giving their lengths.
cd "$d" || exit 1
set -f
set --
i=0
while [ "$i" -lt "$n" ]; do
  [ -s "$i.o" ] && set -- "$@" "$i.o"
  [ -s "$i.e" ] && set -- "$@" "$i.e"
  i=$((i + 1))
done
z=
[ "$#" -gt 0 ] && z=$(stat -c %s -- "$@")
# shellcheck disable=SC2086
set -- $z
echo "sparkrig-parts $n"
i=0
a=0
send=
while [ "$i" -lt "$n" ]; do
  s=lost
  [ -f "$i.s" ] && read -r s <"$i.s"
  o=0
  e=0
  if [ -s "$i.o" ]; then o=$1; shift; fi
  if [ -s "$i.e" ]; then e=$1; shift; fi
  if [ "$o" -gt "$cap" ] || [ "$e" -gt "$cap" ]; then
    s=big
  else
    # Once the reading's bytes are spent, no later part is sent either.
    a=$((a + o + e))
    if [ "$a" -gt "$total" ]; then
      s=over
    else
      [ "$o" -gt 0 ] && send="$send $i.o"
      [ "$e" -gt 0 ] && send="$send $i.e"
    fi
  fi
  case $s in big | over) o=0 e=0 ;; esac
  printf 'part %s %s %s %s\n' "$i" "$s" "$o" "$e"
  i=$((i + 1))
done
if [ -n "$send" ]; then
  printf 'data '
  # shellcheck disable=SC2086
  cat -- $send | base64 -w0
  echo
else
  echo 'data -'
fi
echo sparkrig-parts-end
# {% endraw %}
