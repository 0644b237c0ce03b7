#!/bin/sh
# The command of a `pycli train --docker IMAGE` job container (playbooks/job_container.yml).
# It makes the container reachable by the job's other containers over SSH, as Horovod's
# containers are: an sshd on PYCLI_SSH_PORT with this job's own host key and login key
# (both beside this script, in the job folder); ssh inside the container checks host keys
# strictly against the job's known_hosts. Then sshd runs in the foreground until pycli
# removes the container.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
port=${PYCLI_SSH_PORT:?PYCLI_SSH_PORT is not set}

fail() {
    echo "pycli job container: $*" >&2
    exit 1
}

sshd=$(command -v sshd 2>/dev/null || true)
[ -n "$sshd" ] || sshd=/usr/sbin/sshd
[ -x "$sshd" ] || fail "the image has no sshd: install openssh-server in it (horovodrun and mpirun reach the other nodes' containers over SSH)"
command -v ssh >/dev/null 2>&1 || fail "the image has no ssh client: install openssh-client in it"

mkdir -p /root/.ssh /run/sshd
chmod 700 /root/.ssh
cat >/root/.ssh/config <<EOF
# Written by pycli for job containers: the job's key, the job's host key, strict checks.
Host *
    Port $port
    IdentityFile $here/id_ed25519
    IdentitiesOnly yes
    BatchMode yes
    StrictHostKeyChecking yes
    UserKnownHostsFile $here/known_hosts
    GlobalKnownHostsFile /dev/null
EOF
chmod 600 /root/.ssh/config

# Ranks started over SSH get the image's environment (PATH, LD_LIBRARY_PATH, CUDA_*...),
# as the launcher started with `docker exec` does.
env | grep -E '^[A-Za-z_][A-Za-z0-9_]*=' \
    | grep -vE '^(HOME|HOSTNAME|PWD|OLDPWD|SHLVL|TERM|_|PYCLI_SSH_PORT)=' >/root/.ssh/environment || true

# horovodrun writes `-o StrictHostKeyChecking=no` on its own ssh command line, which beats
# any ssh_config; in this container's copy it becomes `yes`, as the horovod role does on nodes.
for python in python3 python; do
    command -v "$python" >/dev/null 2>&1 || continue
    "$python" - <<'PY' || true
import importlib.util
import pathlib

spec = importlib.util.find_spec("horovod")
for location in (spec.submodule_search_locations or []) if spec else []:
    remote = pathlib.Path(location) / "runner" / "util" / "remote.py"
    if remote.is_file():
        text = remote.read_text()
        if "StrictHostKeyChecking=no" in text:
            remote.write_text(text.replace("StrictHostKeyChecking=no", "StrictHostKeyChecking=yes"))
            print(f"pycli job container: {remote} now checks host keys", flush=True)
PY
done

"$sshd" -t -h "$here/ssh_host_ed25519_key" \
    || fail "the image's sshd refuses its configuration (see above)"
echo "pycli job container: sshd on port $port"
exec "$sshd" -D -e -p "$port" -h "$here/ssh_host_ed25519_key" \
    -o AuthorizedKeysFile="$here/authorized_keys" \
    -o PasswordAuthentication=no \
    -o PermitRootLogin=prohibit-password \
    -o PermitUserEnvironment=yes \
    -o UsePAM=no
