# shellcheck shell=sh
# Validates a new /etc/netplan/40-sparkrig-cluster.yaml before it takes effect: netplan reads
# every file under /etc/netplan, so the new one is checked with all the others, in a
# scratch root, by netplan's generator binary (`netplan generate` would run
# `systemctl daemon-reload` after it, which re-runs the generator over the real
# /etc/netplan). Run as root by sparkrig's cluster. $1: the new file.
g=/usr/libexec/netplan/generate
if [ ! -x "$g" ]; then g=/lib/netplan/generate; fi
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/etc/netplan" && cp -p /etc/netplan/*.yaml "$d/etc/netplan/" 2>/dev/null
cp "$1" "$d/etc/netplan/40-sparkrig-cluster.yaml" && chmod 600 "$d/etc/netplan/40-sparkrig-cluster.yaml" &&
    "$g" --root-dir "$d"
