# shellcheck shell=sh
# Run as the venv's owner (sparkrig's python_stack): copies the file $2 into the directory $1
# (made if missing) as $3, mode 644, atomically.
mkdir -p "$1" && cp -- "$2" "$1/.$3.sparkrig-new" && chmod 644 "$1/.$3.sparkrig-new" && mv -f "$1/.$3.sparkrig-new" "$1/$3"
