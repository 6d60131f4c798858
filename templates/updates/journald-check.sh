# shellcheck shell=sh
# Validates a new journald drop-in ($1) before it takes effect: comments, blank lines, one
# [Journal] section and KEY=VALUE lines of journald's own keys, nothing else (journald skips a
# line it does not understand with a warning, and the journal would not be what was asked).
awk '
  /^[ \t]*([#;].*)?$/ { next }
  /^\[Journal\]$/ { section = 1; next }
  section && /^(Storage|Compress|SystemMaxUse|SystemKeepFree|MaxRetentionSec|SyncIntervalSec)=[A-Za-z0-9.]+$/ { next }
  { bad = 1; print FILENAME ": line " NR " not understood: " $0 > "/dev/stderr" }
  END { exit (bad || !section) }
' "$1"
