#!/usr/bin/env bash
# An apt repository's signing key in the controller cache. It is trusted only when the file
# holds exactly one primary key and that key has the pinned fingerprint: apt trusts every key
# in a signed-by file, so a key appended to it (by a mirror, a proxy, anyone who can write
# the cache) must not pass because the right one is there too.
#
#   apt_key.sh KEYFILE FINGERPRINT KEYRING
#
# checks KEYFILE (ASCII-armoured), dearmors it into KEYRING (a binary keyring for apt's
# signed-by), checks the result the same way and replaces KEYRING only when its content
# differs; prints "updated KEYRING" or "unchanged KEYRING".
#
# Exit 1 with one line on stderr when the key is not to be trusted, 2 on a usage error.
set -euo pipefail

usage() { echo "usage: $0 KEYFILE FINGERPRINT KEYRING" >&2; exit 2; }
refuse() { echo "$*" >&2; exit 1; }

[[ $# -eq 3 ]] || usage
keyfile=$1 keyring=$3
want=$(printf '%s' "$2" | tr -d ' ' | tr '[:lower:]' '[:upper:]')
[[ $want =~ ^[0-9A-F]{40}$ ]] || { echo "fingerprint '$2' is not 40 hex digits" >&2; exit 2; }
[[ -f $keyfile ]] || refuse "$keyfile is missing"

# A keyring of our own, so neither the user's keys nor their gpg.conf take part.
home=$(mktemp -d)
partial=
cleanup() { rm -rf -- "$home"; [[ -z $partial ]] || rm -f -- "$partial"; }
trap cleanup EXIT

check() {  # FILE (named WHAT in messages) holds exactly one primary key, with the pinned fingerprint
  local file=$1 what=$2 listing found
  if ! listing=$(GNUPGHOME=$home gpg --batch --no-options --with-colons --show-keys -- "$file" 2>"$home/err"); then
    refuse "$what: gpg cannot read it as a key ($(tail -n1 "$home/err"))"
  fi
  # The fingerprint of each primary key: the fpr record that follows a pub or sec record
  # (the fpr records of subkeys follow sub or ssb records).
  mapfile -t found < <(awk -F: '$1 == "pub" || $1 == "sec" { primary = 1; next }
                                $1 == "fpr" && primary { print $10; primary = 0 }
                                $1 == "sub" || $1 == "ssb" { primary = 0 }' <<<"$listing")
  case ${#found[@]} in
    0) refuse "$what holds no key; expected only $want" ;;
    1) [[ ${found[0]^^} == "$want" ]] || refuse "$what holds key ${found[0]}, not the pinned $want" ;;
    *) refuse "$what holds ${#found[@]} keys (${found[*]}); expected only $want" ;;
  esac
}

check "$keyfile" "$keyfile"

# Rebuilt from the checked file on every run (not only when missing), so a keyring left by an
# older key or an older check never outlives it; moved in whole, and only when it differs.
mkdir -p -- "$(dirname -- "$keyring")"
partial=$(mktemp -- "$keyring.XXXXXX")
GNUPGHOME=$home gpg --batch --no-options --yes --dearmor --output "$partial" -- "$keyfile" 2>"$home/err" ||
  refuse "$keyfile: gpg cannot dearmor it ($(tail -n1 "$home/err"))"
check "$partial" "the keyring dearmored from $keyfile"
if cmp -s -- "$partial" "$keyring"; then
  echo "unchanged $keyring"
  exit 0
fi
chmod 0644 -- "$partial"
mv -f -- "$partial" "$keyring"
partial=
echo "updated $keyring"
