# shellcheck shell=sh
# Validates a new /etc/tmpfiles.d/sparkrig-jobs.conf before it takes effect: every line is
# a comment or sparkrig's one line (the rule that ages out job records), nothing else.
# Run as: sh -c SCRIPT REGEX FILE ($0: the regex a line must match whole, grep -E; $1: the file).
! grep -Evx "$0" "$1"
