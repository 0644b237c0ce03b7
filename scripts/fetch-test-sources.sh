#!/usr/bin/env bash
# Fetch the sources the tests build from into the controller cache, checksum-pinned.
#
# The upstream OpenMPI tarball (download.open-mpi.org) is the role default, but test
# machines may reach only the Debian mirror, so the tests build Debian's copy of the
# upstream 4.1.4 release instead. They pass it to the role through the same variables
# a user behind a firewall uses (openmpi_source_url / openmpi_source_sha256).
#
# Usage: scripts/fetch-test-sources.sh        (idempotent: a verified file is kept)
set -euo pipefail

cache="${PYCLI_CACHE:-$HOME/.cache/pycli}/downloads"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# name  sha256  url   (sha256 from the Checksums-Sha256 of Debian's signed openmpi_4.1.4-3.dsc)
sources=(
  "openmpi_4.1.4.orig.tar.xz ddaee7dbdb01eb4fab1fda5b5e03e8bbff026711806c095c1f39bb410f99f263 $mirror/pool/main/o/openmpi/openmpi_4.1.4.orig.tar.xz"
)

mkdir -p "$cache"
for entry in "${sources[@]}"; do
  read -r name sum url <<<"$entry"
  target="$cache/$name"
  if [[ -f "$target" ]] && echo "$sum  $target" | sha256sum --check --status; then
    echo "ok      $target"
    continue
  fi
  partial="$target.part"
  curl --fail --silent --show-error --location --retry 3 --max-time 600 -o "$partial" "$url"
  if ! echo "$sum  $partial" | sha256sum --check --status; then
    rm -f "$partial"
    echo "checksum mismatch for $url (expected $sum); not kept" >&2
    exit 1
  fi
  mv "$partial" "$target"
  echo "fetched $target"
done
