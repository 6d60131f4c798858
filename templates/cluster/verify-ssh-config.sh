# shellcheck shell=sh
# Validates a new /etc/ssh/ssh_config.d/50-sparkrig-cluster.conf before it takes effect:
# ssh parses it (ssh -G prints the configuration it would use, connecting nowhere).
# Run as root by sparkrig's cluster. $1: the new file.
ssh -G -F "$1" 127.0.0.1 >/dev/null
