# shellcheck shell=sh
# Prints the CUDA toolkit /usr/local/cuda leads to ("cudadir DIR") and its version.json
# ("cudajson ..." lines), if any. Run by sparkrig's updates (the Versions fact); no arguments.
c=$(readlink -f /usr/local/cuda) && [ -d "$c" ] && {
  echo "cudadir $c"
  [ -f "$c/version.json" ] && sed 's/^/cudajson /' "$c/version.json"
}
true
