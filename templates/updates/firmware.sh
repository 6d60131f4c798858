# shellcheck shell=sh
# fwupd's view of the box, for sparkrig's updates (the Firmware fact): for each fwupdmgr
# command given ("get-devices", "get-updates"), one line "fwupd COMMAND STATUS LIMIT JSON", the JSON
# base64-encoded (a device's name is whatever its firmware, or a USB device, says) and capped;
# "absent CANDIDATE" where fwupdmgr is not installed, with the version apt would install ("(none)":
# apt cannot install it here, e.g. an offline box whose package lists lack it).
# fwupdmgr waits on fwupd over D-Bus (its activation alone may take 25 s, a wedged daemon never
# answers): each is killed after $1 seconds (status 124 or 137).
# Arguments: the time limit in seconds, then the fwupdmgr commands.
limit=$1
shift
if ! command -v fwupdmgr >/dev/null 2>&1; then
  candidate=$(LC_ALL=C apt-cache policy fwupd 2>/dev/null | sed -n 's/^ *Candidate: *//p' | head -n 1)
  echo "absent ${candidate:-(none)}"
  exit 0
fi
for what in "$@"; do
  out=$(timeout -k 5 "$limit" fwupdmgr "$what" --json </dev/null 2>/dev/null)
  status=$?
  printf 'fwupd %s %s %s %s\n' "$what" "$status" "$limit" "$(printf '%s' "$out" | head -c 4194304 | base64 -w0)"
done
true
