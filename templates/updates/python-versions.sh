# Prints "python NAME VERSION" for each distribution NAME installed in a venv, from its
# .dist-info's METADATA, read as the venv's owner (root runs only runuser and sed, which
# root owns; a link in the venv leads only where its owner could read anyway).
# Run by sparkrig's updates (the Versions fact). $1: the venv; $2...: the normalised
# distribution names.
venv=$1; shift
[ -d "$venv/lib" ] || exit 0
owner=$(stat -c %U "$venv") || exit
as_owner() { if [ "$(id -u)" = 0 ] && [ "$owner" != root ]; then runuser -u "$owner" -- "$@"; else "$@"; fi; }
for name in "$@"; do
  find "$venv/lib" -mindepth 3 -maxdepth 3 -type d -path "*/site-packages/$name-*.dist-info" |
  while IFS= read -r dir; do
    version=$(as_owner sed -n 's/^Version: //p;/^$/q' "$dir/METADATA") || exit
    echo "python $name ${version:-?}"
  done || exit
done
