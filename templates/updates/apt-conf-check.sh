# shellcheck shell=sh
# Validates a new /etc/apt/apt.conf.d/99sparkrig-updates ($1) before it takes effect:
# apt-config parses it as apt will, and neither fails nor says a word (a syntax error does).
apt-config -c "$1" dump >/dev/null && ! apt-config -c "$1" dump 2>&1 >/dev/null | grep .
