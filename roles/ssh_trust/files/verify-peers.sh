#!/bin/bash
# Role ssh_trust: log in from this node to its peers, by name and by address, a bounded pool
# at a time, and say which logins failed. Run by verify.yml as the training user
# (ansible.builtin.script).
#
#   verify-peers.sh POOL ATTEMPTS FIRST SCOPE PEER ...
#
# POOL      logins at once
# ATTEMPTS  tries per login when sshd drops the connection before the key exchange (it was
#           busy: sshd's MaxStartups drops unauthenticated connections past 10 by default);
#           other failures are not retried
# FIRST     this node's place among the PEERs (from 0): its ring of peers starts there, so
#           every node starts at its own place and a node receives about POOL logins at a
#           time, whatever the cluster's size
# SCOPE     all: every peer; RING,SAMPLE: the first RING peers after this node in the ring
#           and SAMPLE others drawn at random (this node itself is always checked)
# PEER      NAME=ADDRESS=HOSTNAME: `ssh NAME` and `ssh ADDRESS` must reach the node (host keys
#           checked, batch mode) and `hostname` there must answer HOSTNAME
#
# Prints "ok TARGET" or "FAIL TARGET: why" a line each; exit 1 when any failed, the failures
# repeated on stderr (Ansible's message names them).
set -uo pipefail

pool=${1-}; attempts=${2-}; first=${3-}; scope=${4-}
shift 4 2>/dev/null || { echo "usage: verify-peers.sh POOL ATTEMPTS FIRST SCOPE PEER ..." >&2; exit 2; }
case $pool$attempts$first in '' | *[!0-9]*) echo "verify-peers.sh: POOL, ATTEMPTS and FIRST are whole numbers" >&2; exit 2 ;; esac
peers=("$@")
count=${#peers[@]}
[ "$first" -lt "$count" ] || { echo "verify-peers.sh: FIRST $first is not the place of one of the $count peers" >&2; exit 2; }
ring=("${peers[@]:first}" "${peers[@]:0:first}")
case $scope in
    all) chosen=("${ring[@]}") ;;
    *,*)
        near=${scope%%,*}; sample=${scope#*,}
        case $near$sample in '' | *[!0-9]*) echo "verify-peers.sh: SCOPE is all or RING,SAMPLE" >&2; exit 2 ;; esac
        chosen=("${ring[@]:0:near+1}")
        rest=("${ring[@]:near+1}")
        if [ "${#rest[@]}" -gt 0 ] && [ "$sample" -gt 0 ]; then
            mapfile -t drawn < <(printf '%s\n' "${rest[@]}" | shuf -n "$sample")
            chosen+=("${drawn[@]}")
        fi ;;
    *) echo "verify-peers.sh: SCOPE is all or RING,SAMPLE" >&2; exit 2 ;;
esac

# Each chosen peer by name, then by address, as TARGET=HOSTNAME.
targets=()
for peer in "${chosen[@]}"; do
    IFS== read -r name address hostname <<<"$peer"
    targets+=("$name=$hostname" "$address=$hostname")
done

probe() {
    local target=${1%%=*} expected=${1#*=} out rc try
    for ((try = 1; try <= attempts; try++)); do
        out=$(ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=10 -- "$target" hostname 2>&1 </dev/null)
        rc=$?
        out=${out//$'\r'/}
        if [ "$rc" -eq 0 ]; then
            if [ "$out" = "$expected" ]; then echo "ok $target"; else echo "FAIL $target: answered '$out', not '$expected'"; fi
            return 0
        fi
        case $out in
            *kex_exchange_identification* | *"Connection reset by peer"* | *"Connection closed by"*) ;;
            *) break ;;
        esac
        [ "$try" -lt "$attempts" ] && sleep "$((try * try)).$((RANDOM % 10))"
    done
    echo "FAIL $target: ${out##*$'\n'}"
}
export -f probe
export attempts

results=$(printf '%s\n' "${targets[@]}" | xargs -d '\n' -r -P "$pool" -n 1 bash -c 'probe "$1"' probe)
printf '%s\n' "$results"
failed=$(grep '^FAIL ' <<<"$results")
if [ -n "$failed" ]; then
    printf '%s\n' "$failed" >&2
    exit 1
fi
exit 0
