# shellcheck shell=sh
# Validates a new /etc/docker/daemon.json ($1) before it replaces the one in use; run as root.
# dockerd >= 23 checks the whole configuration; an older one (Debian 12's 20.10) has no
# --validate, and the file is then at least parsed as JSON.
if dockerd --help 2>/dev/null | grep -q -e --validate; then
    dockerd --validate --config-file "$1"
else
    python3 -I -c "import json, sys; json.load(open(sys.argv[1]))" "$1"
fi
