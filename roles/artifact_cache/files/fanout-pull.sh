#!/bin/bash
# Role artifact_cache: pull an artifact from a peer that holds it, over the cluster's own SSH
# trust (the trust user's key and known hosts: batch mode, host keys checked), and keep it
# only when its sha256 is the recorded one. Run as root by fanout.yml; the logins run as USER.
#
#   fanout-pull.sh FILE SHA256 USER SECONDS SOURCE ...
#
# FILE     the artifact's path, the same on every node
# SHA256   what its sha256 must be
# USER     the user whose SSH trust reaches the SOURCEs
# SECONDS  the most one source may take; then the next is tried
# SOURCE   the peers to try, in order (names or addresses USER's ssh reaches)
#
# A source that stops answering mid-transfer (powered off, a frozen node) is left after SSH's
# keepalives go unanswered for 15 s; SECONDS bounds one that answers but is too slow.
#
# Prints "pulled from SOURCE" and exits 0 with FILE in place; a copy that does not match is
# never moved in. Each source that could not serve it is one line on stderr, with why
# (unreachable, no such file, a copy with another sha256); exit 1 when none could.
set -uo pipefail

file=${1-}; want=${2-}; user=${3-}; limit=${4-}
shift 4 2>/dev/null || { echo "usage: fanout-pull.sh FILE SHA256 USER SECONDS SOURCE ..." >&2; exit 2; }
[[ $want =~ ^[0-9a-f]{64}$ ]] || { echo "fanout-pull.sh: SHA256 '$want' is not a sha256" >&2; exit 2; }
[[ $limit =~ ^[1-9][0-9]*$ ]] || { echo "fanout-pull.sh: SECONDS '$limit' is not a whole number of seconds" >&2; exit 2; }
[ $# -gt 0 ] || { echo "fanout-pull.sh: no SOURCE to pull from" >&2; exit 2; }
id -u -- "$user" >/dev/null 2>&1 || { echo "fanout-pull.sh: no user '$user' on this node" >&2; exit 2; }

partial="$file.pull.$$"
trap 'rm -f -- "$partial"' EXIT
mkdir -p -- "$(dirname -- "$file")"
failed=()
for source in "$@"; do
    started=$SECONDS
    err=$(timeout --kill-after=5 "$limit" runuser -u "$user" -- ssh -o BatchMode=yes -o StrictHostKeyChecking=yes \
            -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
            -- "$source" cat -- "$(printf '%q' "$file")" 2>&1 >"$partial" </dev/null)
    code=$?
    if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
        failed+=("$source: not done after $limit s (artifact_cache_fanout_pull_timeout)")
        continue
    elif [ "$code" -ne 0 ]; then
        err=${err//$'\r'/}
        failed+=("$source: ${err##*$'\n'}")
        continue
    fi
    have=$(sha256sum -- "$partial" | cut -d' ' -f1)
    if [ "$have" != "$want" ]; then
        failed+=("$source: its copy has sha256 $have, not $want")
        continue
    fi
    chmod 0644 -- "$partial"
    mv -f -- "$partial" "$file"
    for line in "${failed[@]}"; do echo "$line" >&2; done
    echo "pulled from $source ($((SECONDS - started)) s)"
    exit 0
done
for line in "${failed[@]}"; do echo "$line" >&2; done
exit 1
