# shellcheck shell=sh
# Puts a wheel (or prefix archive) that root staged in its own directory into the wheelhouse,
# as the entry's owner, and checks its sha256 there; a link planted where the new entry goes
# is replaced, never followed. $1: the root-owned incoming directory, $2: the wheelhouse
# entry, $3: the wheel's file name, $4: its sha256.
set -e
rm -rf "$2.new"
mkdir -m 755 "$2.new"
cp -- "$1/$3" "$1/stamp.json" "$2.new/"
cd "$2.new"
echo "$4  $3" | sha256sum --check --quiet
chmod 644 ./*
cd /
rm -rf "$2"
mv "$2.new" "$2"
