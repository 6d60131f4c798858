# shellcheck shell=sh
# Makes Jupyter's token file, 0600 and its owner's; run as root.
# $1: the token's directory, $2: the token file, $3: its owner (Jupyter's user).
# An existing token is kept (not rotated); a new one is 32 random bytes in hex. The directory
# is made by root in root's /var/lib/sparkrig; what is inside it is written by its owner
# (runuser), so root never follows a link the owner planted there.
# The owner's sh gets its script in single quotes: $1 there is its own argument (the file).
# shellcheck disable=SC2016
install -d -m 700 -o "$3" -g "$(id -gn "$3")" "$1" && runuser -u "$3" -- sh -c '[ -s "$1" ] && [ ! -L "$1" ] || { rm -f "$1" && (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d " \n" > "$1.new") && mv -f "$1.new" "$1"; } && chmod 600 "$1"' token "$2"
