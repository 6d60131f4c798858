# shellcheck shell=sh
# Installs an apt repository's signing key after checking its primary fingerprint; run as root.
# $1: the key's URL, $2: the primary fingerprint it must have, $3: the keyring to write.
# The key is imported into a scratch keyring and only the expected key is exported: a key
# file that carries other keys does not widen what the repository may be signed with.
# The awk below is operations/containers/facts.py's PRIMARY_FINGERPRINTS (a test keeps them
# the same): the primary keys' fingerprints (an "fpr" record right after a "pub" one).
t=$(mktemp -d) || exit 1
trap 'gpgconf --homedir "$t" --kill all 2>/dev/null; rm -rf "$t"' EXIT
curl -fsSL --retry 3 -o "$t/key" "$1" || { echo "sparkrig: cannot download $1" >&2; exit 1; }
got=$(gpg --homedir "$t" --batch --with-colons --show-keys "$t/key" 2>/dev/null |
      awk -F: '$1=="pub"{p=1;next} $1=="fpr"&&p{print $10} {p=0}')
# $(echo $got): the fingerprints on one line (split at blanks on purpose), here and below.
# shellcheck disable=SC2086,SC2116
case " $(echo $got) " in
  *" $2 "*) ;;
  *) echo "sparkrig: the key at $1 has fingerprint(s) '$(echo $got)', not $2: refusing it" >&2; exit 1 ;;
esac
# Any step failing is the error below (not an if-then-else).
# shellcheck disable=SC2015
gpg --homedir "$t" --batch --quiet --import "$t/key" 2>/dev/null &&
gpg --homedir "$t" --batch --export "$2" > "$t/keyring" &&
[ -s "$t/keyring" ] || { echo "sparkrig: cannot export key $2 from $1" >&2; exit 1; }
mkdir -p "$(dirname "$3")" &&
install -m 644 -o root -g root "$t/keyring" "$3.sparkrig-new" &&
mv -f "$3.sparkrig-new" "$3"
