# shellcheck shell=sh
# Validates a new fstab ($2) before it replaces the one in use ($1); run as root.
# Managed by sparkrig (sparkrig.operations.swap.operations), which only ever comments out swap entries.
#
# 1. libmount must read the same entries in both files, swap areas aside.
# 2. `findmnt --verify` must find no more parse errors and no more errors in the new
#    file than in the one in use. Not "none": it exits 1 on any error, and a source or
#    mount point absent on this machine (a container, a detached disk) is an error,
#    though the host lacks it and no edit made it. It ends its report with a count,
#    e.g. "0 parse errors, 2 errors, 3 warnings"; a report without one (an unreadable
#    file) fails.
# util-linux 2.41.5 (Debian 13) findmnt dies (SIGSEGV) reading any fstab that holds a
# parse error. When it cannot read the file in use, the new file must parse, whatever
# it says of absent devices, and there are no entries to compare with.
export LC_ALL=C
summary='s/^\([0-9]*\) parse errors*, \([0-9]*\) errors*, .*/\1 \2/p'
verify() {
    report=$(findmnt --verify --tab-file "$1" 2>&1) && { echo "0 0"; return; }
    printf '%s\n' "$report" | sed -n "$summary" | grep . || { printf '%s\n' "$report" >&2; return 1; }
}
entries() {
    list=$(findmnt --tab-file "$1" --raw --noheadings --output SOURCE,TARGET,FSTYPE,OPTIONS,FREQ,PASSNO 2>/dev/null)
    [ $? -le 1 ] || return 1  # 1: no entry at all
    printf '%s\n' "$list" | awk '$3 != "swap"'
}
new=$(verify "$2") && new_entries=$(entries "$2") || exit 1
old=$(verify "$1" 2>/dev/null) || old="0 ${new#* }"
if old_entries=$(entries "$1") && [ "$old_entries" != "$new_entries" ]; then
    echo "fstab-check: $2 changes entries other than swap areas" >&2
    exit 1
fi
if [ "${new% *}" -gt "${old% *}" ] || [ "${new#* }" -gt "${old#* }" ]; then
    echo "fstab-check: findmnt counts more problems in $2 (parse errors, errors: $new) than in $1 ($old)" >&2
    findmnt --verify --tab-file "$2" >&2
    exit 1
fi
