# shellcheck shell=sh
# The distributions installed in the venv $1, as root reads them (the PythonStack fact):
# the names of its site-packages' *.dist-info directories (one field: NUL-separated,
# base64-encoded), and each one's direct_url.json, read through the one reader ($2, with
# the limit $3). Nothing of the venv runs: its owner controls every file here. No link in
# any component: the directory is entered (cd -P) only if its real path is the one written
# (a link reads as "dists unreadable"); an entry that is a link is skipped.
for s in "$1"/lib/python3*/site-packages; do
  [ -d "$s" ] || continue
  if ! cd -P -- "$s" 2>/dev/null || [ "$(pwd -P)" != "$s" ]; then
    echo "dists unreadable"
    exit 0
  fi
  echo "dists $(for e in *.dist-info; do [ -d "$e" ] && [ ! -L "$e" ] && printf '%s\0' "$e"; done | base64 -w0)"
  for e in *.dist-info; do
    if [ -d "$e" ] && [ ! -L "$e" ] && [ -f "$e/direct_url.json" ]; then
      echo "url $(printf '%s' "$e" | base64 -w0) $(sh -c "$2" sparkrig-read "$s/$e/direct_url.json" "$3" | base64 -w0)"
    fi
  done
done
