# shellcheck shell=sh
# NCCL's builds on this host, as root reads them (sparkrig/nccl.py): `sh -c SCRIPT sparkrig-nccl
# VENV READER LIMIT TIMEOUT PREFIX_LIB`. For the venv's nvidia-nccl-cu* wheel (its .dist-info
# name), the system's libnccl2 (dpkg's version) and a prefix build of NCCL, one line each:
#   build KIND NAME VERSION PATH STATUS SHA256 LINES ERR
# every field a user may have written base64-encoded (a name holding a newline forges no line).
# Nothing here runs the venv: each library is read once, through the one reader (READER: no
# link in any component, a regular file of at most LIMIT bytes, killed after TIMEOUT s), into
# sha256sum and, through a FIFO in root's own directory, into the search for the version line
# NCCL embeds ("NCCL version 2.27.7+cuda13.0"): NULs become line ends, long runs are folded,
# and every reader reads to the end (none quits early and cuts the other's input short).
v=$1 reader=$2 limit=$3 tmo=$4 prefix_lib=$5
t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
b() { printf '%s' "$1" | base64 -w0; }
build() {  # KIND NAME VERSION PATH
  rm -f "$t/p" && mkfifo -m 600 "$t/p" || exit 1
  tr '\000' '\n' < "$t/p" | fold -b -w 4096 | grep -a '^NCCL version [0-9]' | cut -b 1-256 | sed -n '1,8p' > "$t/v" &
  sum=$({ timeout -k 1 "$tmo" sh -c "$reader" sparkrig-read "$4" "$limit" 2>"$t/e"; echo $? > "$t/s"; } \
    | tee "$t/p" | sha256sum)
  wait
  echo "build $1 $(b "$2") $(b "$3") $(b "$4") $(cat "$t/s") ${sum%% *} $(base64 -w0 < "$t/v") $(head -c 500 "$t/e" | base64 -w0)"
}
for s in "$v"/lib/python3*/site-packages; do
  [ -d "$s" ] || continue
  for e in "$s"/nvidia_nccl_cu*.dist-info; do
    if [ -d "$e" ] && [ ! -L "$e" ]; then build venv "${e##*/}" "" "$s/nvidia/nccl/lib/libnccl.so.2"; fi
  done
done
d=$(dpkg-query -W -f='${db:Status-Abbrev} ${Version}' libnccl2 2>/dev/null) || d=
case $d in ?"i "*) d=${d#???}; d=${d# } ;; *) d= ;; esac  # installed, held ("hi", as CUDA's images hold it) or not
for f in /usr/lib/*-linux-gnu/libnccl.so.2; do
  [ -e "$f" ] || continue
  build system libnccl2 "$d" "$(readlink -f -- "$f")"
  break
done
if [ -n "$prefix_lib" ] && [ -e "$prefix_lib" ]; then
  build prefix nccl "" "$(readlink -f -- "$prefix_lib")"
fi
exit 0
