# shellcheck shell=sh
# Validates a new /etc/apt/preferences.d/sparkrig-known-bad ($1) before it takes effect: each
# record exactly Explanation (the entry), Package, Pin (a version), Pin-Priority -1, as
# sparkrig's updates writes them; then apt itself must read the file without a word
# (preferences alone: an empty directory for the parts).
awk '/^#/ { next }
  /^$/ { if (s != 0 && s != 4) { bad = 1; exit } s = 0; next }
  s == 0 && /^Explanation: known-bad [a-z0-9][a-z0-9._-]*$/ { s = 1; next }
  s == 1 && /^Package: [a-z0-9*?][a-z0-9+.*?-]*$/ { s = 2; next }
  s == 2 && /^Pin: version [A-Za-z0-9*][A-Za-z0-9.+~:*-]*$/ { s = 3; next }
  s == 3 && /^Pin-Priority: -1$/ { s = 4; next }
  { bad = 1; exit }
  END { if (bad || (s != 0 && s != 4)) exit 1 }' "$1" || exit
parts=$(mktemp -d) || exit
said=$(apt-cache -o Dir::Etc::Preferences="$1" -o Dir::Etc::PreferencesParts="$parts" policy 2>&1 >/dev/null)
status=$?
rmdir "$parts"
if [ "$status" -ne 0 ] || [ -n "$said" ]; then echo "$said" >&2; exit 1; fi
