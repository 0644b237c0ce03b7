#!/bin/bash
# Starts the container of a `pycli train --docker IMAGE` job on this node and waits for its
# sshd. pycli stages it into the job folder's container/ as start.sh, beside entry.sh (the
# container's command) and the job's keys. Over SSH, playbooks/job_container.yml runs it on
# every node of the job; through Slurm, the batch script runs it as the job's first step, on
# every node of the allocation, so that the containers start inside the job and only on its
# nodes (Slurm's epilog, pycli_node.node_gate, removes them when the job ends, however it ends).
#
# Usage: start.sh NAME IMAGE PORT WORK_DIR JOB_DIR GPUS LABEL...
#   GPUS   "all": every GPU of the node (the ranks see those CUDA_VISIBLE_DEVICES names);
#          else the indexes of the node's GPUs the job holds ("0,2"; empty for none), Slurm's
#          (the step's SLURM_STEP_GPUS, N being /dev/nvidiaN): with NVIDIA's runtime
#          `--gpus "device=UUID,..."` (each GPU found by its minor number in nvidia-smi -q),
#          without it those GPUs' device files.
#   LABEL  key=value, one or more: what the container is found and removed by.
# The node's own `docker run` options (the inventory's, then --docker-opt's), one a line, are in
# run-options beside this script (playbooks/job_container.yml writes it, mode 600: an option
# may carry a secret, so none is on a command line).
# Prints one line on success; on failure one line on stderr, exit 1.
set -u

fail() {
    echo "$*" >&2
    exit 1
}

[ $# -ge 7 ] || fail "usage: $0 NAME IMAGE PORT WORK_DIR JOB_DIR GPUS LABEL..."
name=$1 image=$2 port=$3 work_dir=$4 job_dir=$5 gpus=$6
shift 6
here=$(cd "$(dirname "$0")" && pwd)
last_line() { printf '%s\n' "$1" | grep -v '^$' | tail -n 1; }

if ! said=$(docker version --format '{{.Server.Version}}' 2>&1); then
    fail "Docker does not answer on this node ($(last_line "${said:-no docker command}")): provision it (the docker role of playbooks/site.yml)"
fi
if ! docker image inspect "$image" >/dev/null 2>&1; then
    said=$(docker pull -q "$image" 2>&1) \
        || fail "image $image is not on the node and cannot be pulled: $(last_line "${said:-no reason given}")"
fi
# Nothing may listen on the port yet: the containers share the node's network.
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "port $port is already in use on the node (another job's container?): choose another with --docker-ssh-port"
fi

gpu_args=()
gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$gpus" = all ]; then
    [ "$gpu_count" -gt 0 ] && gpu_args=(--gpus all)
elif [ -n "$gpus" ] && [ "$gpu_count" -gt 0 ]; then
    # Slurm's GPU N is /dev/nvidiaN (gres.conf's File, or NVML's minor number): named to the
    # runtime by its UUID, as nvidia-smi's own order need not be the device files'.
    uuids=()
    by_minor=$(nvidia-smi -q | awk '/GPU UUID/ {uuid = $NF} /Minor Number/ {print $NF, uuid}')
    for index in ${gpus//,/ }; do
        uuid=$(printf '%s\n' "$by_minor" | awk -v n="$index" '$1 == n {print $2}')
        [ -n "$uuid" ] || fail "GPU $index of the job: nvidia-smi -q lists no GPU with minor number $index on this node"
        uuids+=("$uuid")
    done
    gpu_args=(--gpus "\"device=$(IFS=,; echo "${uuids[*]}")\"")
elif [ -n "$gpus" ]; then
    for index in ${gpus//,/ }; do
        [ -e "/dev/nvidia$index" ] || fail "GPU $index of the job has no device file /dev/nvidia$index on this node"
        gpu_args+=(--device "/dev/nvidia$index")
    done
fi

labels=()
for label in "$@"; do
    labels+=(--label "$label")
done
options=()
[ -f "$here/run-options" ] && mapfile -t options <"$here/run-options"

# SYS_PTRACE: Docker's seccomp profile refuses process_vm_readv without it, and Open MPI's
# shared memory reads a large message from the other rank's memory with it (one copy). Without
# it every such message prints "Read -1, expected N, errno = 1" and is sent again by copies. It
# reaches only the container's own processes (its own PID namespace).
said=$(docker run --detach --name "$name" "${labels[@]}" --user 0 --ipc host --cap-add SYS_PTRACE "${gpu_args[@]}" \
    --volume "$work_dir:$work_dir" --workdir "$job_dir" --env "PYCLI_SSH_PORT=$port" --entrypoint /bin/sh \
    "${options[@]}" "$image" "$job_dir/container/entry.sh" 2>&1) \
    || fail "docker run failed: $(last_line "${said:-no reason given}")"

# sshd -e logs "Server listening on ..." once it listens; a container that stopped will not,
# and its last words say why.
last_words() { last_line "$(docker logs --tail 5 "$name" 2>&1)"; }
for _ in $(seq 120); do
    if [ "$(docker inspect -f '{{.State.Running}}' "$name")" != true ]; then
        fail "the container stopped: $(last_words)"
    fi
    case "$(docker logs "$name" 2>&1)" in *"Server listening on"*)
        echo "pycli: job container $name from $image up on ${SLURMD_NODENAME:-$(hostname)} (GPUs: ${gpu_args[*]:-none})"
        exit 0 ;;
    esac
    sleep 0.5
done
fail "no sshd listening after 60 s: $(last_words)"
