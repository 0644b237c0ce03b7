#!/bin/bash
# Stages one pycli job on one node. pycli/jobs/files.py sends this script over SSH as the
# command (bash -c), once to ask (MODE check) and, only where something is missing, once more
# with a tar stream on stdin (MODE receive).
#
#   stage-job.sh MODE JOB_DIR STORE KEEP PORT [ITEM ...]
#
# MODE     check: place what the node's store already holds, name what it lacks;
#          receive: first unpack stdin's tar (top folders named by digest, or direct-DIGEST)
# JOB_DIR  the job's folder; its siblings are the other jobs' folders
# STORE    the node's store: STORE/DIGEST holds one item's files
# KEEP     how many job folders to keep, this job's among them (0: all); the store keeps as
#          many entries, the newest used first
# PORT     1: name a TCP port free on this node now (torchrun's rendezvous on the first node)
# ITEM     DIGEST:HOW:DEST, HOW one of
#          tree   a folder's contents, hard-linked from the store into the folder DEST
#          file   one file (the store entry's "file"), hard-linked to DEST
#          data   used in place from the store (the job reads STORE/DIGEST); nothing placed
#          direct never stored (private keys): the tar's direct-DIGEST folder becomes DEST
#
# Prints one fact a line: "cpus N", "gpus N", "port N", "need DIGEST", "removed JOB" and
# "kept-back MESSAGE" (an old job folder that cannot be removed). Exit 2: bad arguments.
set -uo pipefail

mode=${1-}; job=${2-}; store=${3-}; keep=${4-}; port=${5-}
shift 5 2>/dev/null || { echo "usage: stage-job.sh MODE JOB_DIR STORE KEEP PORT [ITEM ...]" >&2; exit 2; }
case $keep in
    '' | *[!0-9]*)
        echo "pycli_jobs_kept is '$keep': give how many job folders a node keeps, a whole number (0: all)" >&2
        exit 2 ;;
esac
case $mode in check | receive) ;; *) echo "stage-job.sh: unknown mode '$mode'" >&2; exit 2 ;; esac

jobs=$(dirname -- "$job")
job_id=$(basename -- "$job")
mkdir -p -- "$job" "$store" || exit 1

# The folders of the jobs Slurm still has, queued or running (squeue's work folders): a queued
# job has no process yet to name its folder or the store entries it reads (.store-items in its folder).
# Where the node has Slurm's squeue and it cannot answer, nothing is pruned this time.
queued=
if [ "$mode" = check ] && [ "$keep" -gt 0 ] && command -v squeue >/dev/null 2>&1; then
    queued=$(squeue -h -o %Z 2>/dev/null) || keep=0
fi
held_items=" $(while read -r dir; do [ -n "$dir" ] && cat -- "$dir/.store-items" 2>/dev/null; done <<<"$queued" | tr '\n' ' ')"

# Job folders are named as pycli names jobs (time-pid); the oldest go beyond the newest KEEP,
# unless a process still names one (a job still running, started by another controller) or Slurm
# still has its job.
if [ "$mode" = check ] && [ "$keep" -gt 0 ]; then
    (cd -- "$jobs" && ls -1) | grep -E '^[0-9]{8}-[0-9]{6}-[0-9]+$' | grep -vxF -- "$job_id" \
        | sort -t- -k1,1 -k2,2 -k3,3n | head -n -"$((keep - 1))" \
        | while read -r old; do
            pgrep -f -- "$jobs/$old([/ ]|\$)" >/dev/null && continue
            grep -qxF -- "$jobs/$old" <<<"$queued" && continue
            if err=$(rm -rf -- "${jobs:?}/$old" 2>&1); then
                echo "removed $old"
            else
                echo "kept-back ${err##*$'\n'}"
            fi
        done
fi

if [ "$mode" = receive ]; then
    incoming=$(mktemp -d "$store/.incoming-XXXXXX") || exit 1
    trap 'rm -rf -- "$incoming"' EXIT
    tar -x --no-same-owner -C "$incoming" -f - || exit 1
    for entry in "$incoming"/*; do
        [ -e "$entry" ] || continue
        name=${entry##*/}
        case $name in
            direct-*) continue ;;
            # Another job may store the same entry at the same time: the same content; a rename
            # is whole, so the one that is there is complete.
            *) [ -d "$store/$name" ] || mv -T -- "$entry" "$store/$name" 2>/dev/null || [ -d "$store/$name" ] || exit 1 ;;
        esac
    done
fi

status=0
used=" "
for item in "$@"; do
    IFS=: read -r digest how dest <<<"$item"
    used+="$digest "
    src=$store/$digest
    case $how in
        direct)
            [ "$mode" = receive ] || { echo "need $digest"; continue; }
            mkdir -p -- "$(dirname -- "$dest")" && rm -rf -- "$dest" && mv -T -- "$incoming/direct-$digest" "$dest" || status=1
            continue ;;
        tree | file | data) ;;
        *) echo "stage-job.sh: unknown item kind '$how' in '$item'" >&2; exit 2 ;;
    esac
    [ -d "$src" ] || { echo "need $digest"; continue; }
    case $how in
        tree) mkdir -p -- "$dest" && { cp -alf -- "$src/." "$dest/" 2>/dev/null || cp -af -- "$src/." "$dest/"; } ;;
        file) mkdir -p -- "$(dirname -- "$dest")" && { ln -f -- "$src/file" "$dest" 2>/dev/null || cp -af -- "$src/file" "$dest"; } ;;
        data) true ;;
    esac || status=1
    touch -- "$src"
done

# What this job reads from the store, kept in its folder (.store-items) for the prune below.
if [ "$mode" = check ]; then
    printf '%s\n' $used > "$job/.store-items" || status=1
fi

# The store: entries beyond the newest KEEP used go, unless this job uses one, a process names
# one (a job reading its data) or a job Slurm still has uses one.
if [ "$mode" = check ] && [ "$keep" -gt 0 ]; then
    (cd -- "$store" && ls -1t) | grep -E '^[0-9a-f]{16,64}$' | tail -n +"$((keep + 1))" \
        | while read -r old; do
            [[ $used == *" $old "* || $held_items == *" $old "* ]] && continue
            pgrep -f -- "$store/$old([/ ]|\$)" >/dev/null || rm -rf -- "${store:?}/$old"
        done
fi

echo "cpus $(nproc)"
echo "gpus $(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
if [ "$port" = 1 ]; then
    python3 -c "import socket; s = socket.socket(); s.bind(('', 0)); print('port', s.getsockname()[1])" || status=1
fi
exit $status
