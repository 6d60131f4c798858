# shellcheck shell=sh
# Validates a new /etc/netplan/40-sparkrig-cluster.yaml before it takes effect: netplan reads
# every file under /etc/netplan, so the new one is checked with all the others, in a
# scratch root (netplan generate --root-dir). Run as root by sparkrig's cluster.
# $1: the new file.
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/etc/netplan" && cp /etc/netplan/*.yaml "$d/etc/netplan/" 2>/dev/null
cp "$1" "$d/etc/netplan/40-sparkrig-cluster.yaml" && netplan generate --root-dir "$d"
