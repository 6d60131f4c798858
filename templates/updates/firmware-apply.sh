# shellcheck shell=sh
# Installs the firmware updates fwupd's metadata offers (updates_firmware = "apply"), then
# marks the box as needing a reboot as Debian's packages mark one (/run/reboot-required, and
# "fwupd" in /run/reboot-required.pkgs): the rollout reboots it, sparkrig's deploy never does.
# fwupdmgr exits 2 when there was nothing to do: no mark then.
# Arguments: the time limit in seconds (a flash may take minutes; a wedged daemon is stopped).
cd / || exit 1
timeout -k 30 "$1" fwupdmgr update --assume-yes --no-reboot-check </dev/null
status=$?
if [ "$status" = 2 ]; then exit 0; fi
if [ "$status" != 0 ]; then exit "$status"; fi
touch /run/reboot-required
grep -qx fwupd /run/reboot-required.pkgs 2>/dev/null || echo fwupd >>/run/reboot-required.pkgs
