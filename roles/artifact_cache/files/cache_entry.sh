#!/usr/bin/env bash
# One entry of the controller cache: a file and, beside it, FILE.sha256 that records its
# sha256. An entry counts only when both are there and agree; anything else (a truncated
# file, a missing or stale .sha256) is absent and gets rebuilt. Every reader and writer of
# an entry holds FILE.lock (flock), so two runs sharing one cache never see half an entry.
#
#   cache_entry.sh check FILE            prints the sha256 of a whole entry, or nothing
#   cache_entry.sh publish PARTIAL FILE  moves PARTIAL in as FILE with its sha256, unless a
#                                        whole entry is already there (then PARTIAL goes)
#   cache_entry.sh pack DIR FILE         makes FILE a tar of DIR's content (sorted, owners and
#                                        times fixed, so the same files give the same sha256)
#                                        and keeps the entry as it is when nothing changed
set -euo pipefail

usage() { echo "usage: $0 check FILE | publish PARTIAL FILE | pack DIR FILE" >&2; exit 2; }

recorded() {  # the sha256 of FILE when FILE.sha256 is there and matches it
  local file=$1 want have
  [[ -f $file && -f $file.sha256 ]] || return 1
  want=$(cut -d' ' -f1 <"$file.sha256")
  have=$(sha256sum -- "$file" | cut -d' ' -f1)
  [[ -n $want && $want == "$have" ]] || return 1
  echo "$have"
}

case ${1:-} in
  check)
    [[ $# -eq 2 ]] || usage
    file=$2
    mkdir -p -- "$(dirname -- "$file")"
    exec 9>"$file.lock"
    flock --shared 9
    recorded "$file" || true
    ;;
  publish)
    [[ $# -eq 3 ]] || usage
    partial=$2 file=$3
    mkdir -p -- "$(dirname -- "$file")"
    exec 9>"$file.lock"
    flock 9
    if recorded "$file" >/dev/null; then
      rm -f -- "$partial"
      echo "kept $file"
      exit 0
    fi
    sum=$(sha256sum -- "$partial" | cut -d' ' -f1)
    printf '%s  %s\n' "$sum" "$(basename -- "$file")" >"$file.sha256.part"
    mv -f -- "$partial" "$file"
    mv -f -- "$file.sha256.part" "$file.sha256"
    echo "published $file"
    ;;
  pack)
    [[ $# -eq 3 ]] || usage
    dir=$2 file=$3
    [[ -d $dir ]] || { echo "$0: no folder $dir to pack" >&2; exit 1; }
    mkdir -p -- "$(dirname -- "$file")"
    exec 9>"$file.lock"
    flock 9
    tar --create --file="$file.part" --directory="$dir" --sort=name --mtime=@0 \
      --owner=0 --group=0 --numeric-owner --mode=go-w .
    sum=$(sha256sum -- "$file.part" | cut -d' ' -f1)
    if [[ $(recorded "$file" || true) == "$sum" ]]; then
      rm -f -- "$file.part"
      echo "kept $file"
      exit 0
    fi
    printf '%s  %s\n' "$sum" "$(basename -- "$file")" >"$file.sha256.part"
    mv -f -- "$file.part" "$file"
    mv -f -- "$file.sha256.part" "$file.sha256"
    echo "packed $file"
    ;;
  *) usage ;;
esac
