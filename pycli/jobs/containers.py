"""`pycli train --docker IMAGE`: the job's ranks run inside one container per node.

Each node of the job starts a container of IMAGE on the host network (`--ipc=host`, every
GPU when the node has any), with the node's work folder mounted at the same path, so the
staged workload, data and results sit where they sit without containers. In every container
an sshd listens on the job's port with keys made for this job alone: one host key that every
container presents, listed in a known_hosts file under each node's name and address, and one
login key. horovodrun and mpirun in the launcher's container reach the others exactly as they
reach nodes, with strict host-key checking; nothing of the nodes' own SSH trust enters the
image. This module holds the pure parts (names, checks, key files, the Slurm step that starts
the containers); the job folder's container/start.sh starts a container (its one `docker run`),
run on each node by the playbook `playbooks/job_container.yml` over SSH, and through Slurm by the
job's first step, inside its allocation. The playbook removes them after the job; through Slurm,
the epilog on each node does too (pycli_node.node_gate), whoever ends the job.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pycli.cluster.model import Host
from pycli.core.errors import BadInput
from pycli.core.paths import NODE_PACKAGE
from pycli_node.node_gate import CONTAINER_KEYS, SLURM_JOB_LABEL

# The sshd of every job container (--docker) listens here over SSH, on the nodes' network; the
# port Horovod's documentation uses. Not the nodes' own SSH port (cluster_model.DEFAULT_SSH_PORT,
# 22). Through Slurm, where jobs share nodes, a job without --docker-ssh-port gets a port of its
# own instead, picked as it starts (pycli.jobs.slurm.CONTAINER_SSH_PORTS), which the batch script
# puts in SSH_PORT_ENV: two --docker jobs on one node at once collided on this one.
DEFAULT_JOB_SSH_PORT = 12345
SSH_PORT_ENV = "PYCLI_JOB_SSH_PORT"
ENTRY_SCRIPT = NODE_PACKAGE / "job-container.sh"
START_SCRIPT = NODE_PACKAGE / "job-container-start.sh"
LABEL_JOB = "io.pycli.job"
# The Docker reference grammar (distribution/reference), without the rarely used
# uppercase-free domain subtleties: [registry[:port]/]name[/name...][:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
# Options pycli sets itself; a second value would fight the job's layout.
_OWN_OPTIONS = ("--name", "--network", "--net", "--entrypoint", "--user", "-u", "--rm", "-d", "--detach")


@dataclass(frozen=True)
class JobContainer:
    """How the job's containers are made: the image, the sshd port (--docker-ssh-port; None: pycli's
    choice, port()), extra `docker run` options."""

    image: str
    ssh_port: int | None = None
    run_options: tuple[str, ...] = ()

    def name(self, job_id: str) -> str:
        return f"pycli-job-{job_id}"

    def port(self, slurm: bool) -> int | None:
        """The containers' sshd port where it is known before the job starts: --docker-ssh-port's,
        else DEFAULT_JOB_SSH_PORT over SSH; None through Slurm without --docker-ssh-port (the job's
        own, in SSH_PORT_ENV as it starts)."""
        if self.ssh_port is not None:
            return self.ssh_port
        return None if slurm else DEFAULT_JOB_SSH_PORT


def parse_job_container(image: str, ssh_port: int | None, options: Sequence[str], hosts: Sequence[Host]) -> JobContainer:
    """Check --docker, --docker-ssh-port (None: not given) and --docker-opt against each other and the hosts."""
    if not _IMAGE_REFERENCE.match(image):
        raise BadInput(f"--docker {image!r} is not an image reference "
                       "(like horovod/horovod:0.28.1 or registry:5000/team/image:tag)")
    if ssh_port is not None and not 1 <= ssh_port <= 65535:
        raise BadInput(f"--docker-ssh-port {ssh_port}: a TCP port is 1..65535")
    taken = sorted({h.name for h in hosts if h.port == (ssh_port or DEFAULT_JOB_SSH_PORT)})
    if taken:
        raise BadInput(
            f"--docker-ssh-port {ssh_port or DEFAULT_JOB_SSH_PORT} is the SSH port of {', '.join(taken)}; the containers "
            "share the nodes' network, so their sshd needs a port of its own"
        )
    run_options: list[str] = []
    for text in options:
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise BadInput(f"--docker-opt {text!r}: {exc}") from None
        for word in words:
            if "\n" in word:  # start.sh reads the options one a line
                raise BadInput(f"--docker-opt {text!r}: an option cannot hold a line break")
            if any(marker in word for marker in ("{{", "{%", "{#")):  # Ansible would evaluate them on the controller
                raise BadInput(f"--docker-opt {text!r}: an option cannot hold '{{{{', '{{%' or '{{#'")
            if word.split("=", 1)[0] in _OWN_OPTIONS:
                raise BadInput(f"--docker-opt {text!r}: pycli sets {word.split('=', 1)[0]} itself")
        run_options += words
    return JobContainer(image=image, ssh_port=ssh_port, run_options=tuple(run_options))


# `docker run` options that would hand a Slurm job's containers devices Slurm did not give the job
# (each takes a value but --privileged); and the environment and mounts that would.
_DEVICE_OPTIONS = ("--privileged", "--device", "--gpus", "--device-cgroup-rule", "--runtime", "--cgroup-parent")
_ENV_OPTIONS = ("-e", "--env")
_MOUNT_OPTIONS = ("-v", "--volume", "--mount")
# NVIDIA's runtime reads the GPUs to hand a container from these variables of the container's.
_GPU_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


def _option_values(options: Sequence[str]) -> list[tuple[str, str]]:
    """(option, value) for every --docker-opt word, "--opt=value" and "--opt value" alike; a word
    that is not an option is the previous option's value."""
    pairs: list[tuple[str, str]] = []
    for word in options:
        if word.startswith("-"):
            name, _, value = word.partition("=")
            pairs.append((name, value))
        elif pairs and not pairs[-1][1]:
            pairs[-1] = (pairs[-1][0], word)
    return pairs


def wider_than_slurm(container: JobContainer) -> str | None:
    """Through Slurm, each job container gets the GPUs Slurm gave the job on its node and no
    others (start.sh); the line that refuses a --docker-opt that would give it more (any device,
    a privileged container, another runtime, NVIDIA's variables, a mount of /dev), else None."""
    for option, value in _option_values(container.run_options):
        variable = value.split("=", 1)[0]
        source = value.split(":", 1)[0] if option != "--mount" else next(
            (part.split("=", 1)[1] for part in value.split(",") if part.startswith(("source=", "src="))), "")
        if (option in _DEVICE_OPTIONS or (option in _ENV_OPTIONS and variable in _GPU_VARIABLES)
                or (option in _MOUNT_OPTIONS and PurePosixPath(source or "/x").is_relative_to("/dev"))):
            shown = f"{option} {value}".strip()
            return (f"--docker-opt {shown!r}: through Slurm a job's containers get the GPUs and devices Slurm gave "
                    "the job and no others, and this would widen them; ask Slurm with --gpus-per-node, or run "
                    "the job over SSH (--scheduler ssh)")
    return None


def known_hosts_line(hosts: Sequence[Host], port: int | None, host_public_key: str) -> str:
    """One line: the job's host key under every name the launchers may use, on the job's port (any
    port where it is picked as the job starts: the key is this job's alone)."""
    names: list[str] = []
    for host in hosts:
        for name in (host.name, host.address):
            if name not in names:
                names.append(name)
    names += [n for n in ("localhost", "127.0.0.1", "::1") if n not in names]
    key_type, key_data = host_public_key.split()[:2]
    return ",".join(f"[{name}]:{'*' if port is None else port}" for name in names) + f" {key_type} {key_data}\n"


def authorized_keys_line(login_public_key: str, job_id: str) -> str:
    # restrict: no forwarding, no pty; horovodrun and mpirun need neither.
    key_type, key_data = login_public_key.split()[:2]
    return f"restrict {key_type} {key_data} pycli-job-{job_id}\n"


def _new_key() -> tuple[bytes, str]:
    """A fresh ed25519 key pair: (private key in OpenSSH format, public key line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode()


# Files the containers read from the job folder (container/ beside the workloads).
PRIVATE_FILES = CONTAINER_KEYS


def write_container_files(folder: Path, hosts: Sequence[Host], container: JobContainer, job_id: str,
                          slurm: bool) -> None:
    """Make the job's keys, known_hosts and authorized_keys, and the entry script, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    host_private, host_public = _new_key()
    login_private, login_public = _new_key()
    files = {
        "ssh_host_ed25519_key": (host_private.decode(), 0o600),
        "id_ed25519": (login_private.decode(), 0o600),
        "known_hosts": (known_hosts_line(hosts, container.port(slurm), host_public), 0o644),
        "authorized_keys": (authorized_keys_line(login_public, job_id), 0o600),
        "entry.sh": (ENTRY_SCRIPT.read_text(), 0o755),
        "start.sh": (START_SCRIPT.read_text(), 0o755),
    }
    for name, (text, mode) in files.items():
        path = folder / name
        path.write_text(text)
        path.chmod(mode)


def forget_private_keys(folder: Path) -> None:
    """Once staged, the controller keeps no copy of the job's private keys."""
    for name in PRIVATE_FILES:
        (folder / name).unlink(missing_ok=True)


def exec_line(container: JobContainer, job_id: str, workdir: PurePosixPath, env: Sequence[str], argv: Sequence[str],
              tty: bool = True, passed: Sequence[str] = ()) -> str:
    """The shell line a node runs to start `argv` inside the job's container, with `env`
    (NAME=VALUE) and the `passed` variables' values of the node's shell: with a tty for Ctrl-C
    over SSH; without one in a Slurm batch script, which has none (scancel stops it)."""
    env_args = [arg for pair in (*env, *passed) for arg in ("-e", pair)]
    return "exec " + shlex.join(["docker", "exec", "-it" if tty else "-i", "-w", str(workdir), *env_args,
                                 container.name(job_id), *argv])


def slurm_start_line(container: JobContainer, job_id: str, job_dir: PurePosixPath, work_dir: PurePosixPath) -> str:
    """The shell line of a Slurm job's first step, on each node of its allocation: the job's
    container with the node's GPUs Slurm gave the job (SLURM_STEP_GPUS: a step gets all of the
    job's GPUs on its node), labelled with the Slurm job's id for the epilog to remove it; its sshd
    on --docker-ssh-port, else on the job's own port (SSH_PORT_ENV, which the batch script sets)."""
    port = container.port(slurm=True)
    words = shlex.join([str(job_dir / "container" / "start.sh"), container.name(job_id), container.image])
    return (words + " " + (f'"${SSH_PORT_ENV}"' if port is None else str(port)) + " "
            + shlex.join([str(work_dir), str(job_dir)]) + ' "${SLURM_STEP_GPUS:-}" '
            + shlex.quote(f"{LABEL_JOB}={job_id}") + f' "{SLURM_JOB_LABEL}=$SLURM_JOB_ID"')


def playbook_vars(container: JobContainer, job_id: str, job_dir: PurePosixPath, work_dir: PurePosixPath,
                  state: str) -> dict[str, Any]:
    return {
        "pycli_container_state": state,
        "pycli_container_name": container.name(job_id),
        "pycli_container_image": container.image,
        "pycli_container_ssh_port": container.port(slurm=False),
        "pycli_container_run_options": list(container.run_options),
        "pycli_container_label": f"{LABEL_JOB}={job_id}",
        "pycli_job_dir": str(job_dir),
        "pycli_work_dir": str(work_dir),
    }
