# shellcheck shell=sh
# sshd is restarted only if its configuration is valid: a broken sshd_config (whoever
# broke it) would otherwise lock every user out at the restart. Checked before anything
# changes, so a refusal leaves the host as it was. Run as root by sparkrig's sshd_guard.
# $1: the unit that runs sshd (named in the message).
if ! out=$(sshd -t 2>&1); then
    printf 'sparkrig: refusing to restart %s: sshd -t fails, fix the sshd configuration first:\n%s\n' "$1" "$out" >&2
    exit 1
fi
