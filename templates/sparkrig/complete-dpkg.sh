# shellcheck shell=sh
# Finishes an interrupted dpkg run (sparkrig/packages.py). $@: apt-get and its options.
broken=$(dpkg-query -W -f '${db:Status-Abbrev} ${binary:Package}\n' 2>/dev/null |
  awk 'substr($1, 2, 1) == "H" || substr($1, 3, 1) == "R" { print $2 }')
# $broken is a list of package names: one word each.
# shellcheck disable=SC2086
if [ -n "$broken" ]; then
  echo "sparkrig: reinstalling what an interrupted dpkg run left half-installed:" $broken >&2
  dpkg --configure -a >&2 || true
  "$@" update && "$@" install --reinstall $broken || exit
fi
dpkg --configure -a
