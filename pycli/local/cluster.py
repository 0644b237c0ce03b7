"""A local cluster: systemd node containers on a dedicated Docker network, reached over SSH.

It gives the same experience as real servers: Ansible connects over real SSH with a
controller key and checks host keys, which are read from each node through the Docker
API (a trusted channel) rather than accepted on first use. A failed `up` removes
everything it made. What the cluster will be (names, addresses, inventory) is planned
first, without Docker, in pycli/local/plan.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import ipaddress
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pycli.cluster import runner
from pycli.cluster.drained import forget_drained
from pycli.cluster.inventory_writer import NODES_GROUP, write_text_atomically
from pycli.core.errors import BadInput, PycliError, Unreachable
from pycli.core.paths import new_run_dir
from pycli.local.image import ImageSpec, ensure_image
from pycli.local.plan import (
    INVENTORY_MARKER,
    LOCAL_NODE_SLOTS,
    SHARED_DIR,
    ClusterPlan,
    NodePlan,
    check_inventory_owner,
    cluster_lock_path,
    cluster_role_state_dirs,
    cluster_state_dir,
    default_inventory_path,
    inventory_owner,
    network_name,
    parse_subnet,
    pick_subnet,
    plan_cluster,
    render_local_inventory,
    shared_volume_name,
    validate_name,
    validate_node_count,
    validate_slots,
)

if TYPE_CHECKING:  # the docker SDK costs a quarter second to import: only commands that use it pay
    import docker
    from docker.models.containers import Container

LABEL_CLUSTER = "io.pycli.cluster"
LABEL_NODE = "io.pycli.node"
LABEL_INVENTORY = "io.pycli.inventory"
BOOT_TIMEOUT_S = 120
NVIDIA_MAJOR = 195
# Stand-in GPUs a node may have (/dev/nvidia0 ...): an eight-GPU server's.
STANDIN_GPUS_AT_MOST = 8
# Nodes `cluster down` removes at once (within the Docker client's pool of 10 connections).
REMOVE_AT_ONCE = 8


@contextlib.contextmanager
def cluster_lock(name: str) -> Iterator[None]:
    """Hold cluster `name` for one `up` or `down`; a second pycli is refused, not made to wait
    (two `up`s of one name would each remove the other's containers)."""
    path = cluster_lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise BadInput(f"cluster {name} is being changed by another pycli (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _read_if_there(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None


def _cluster_containers(client: docker.DockerClient, name: str) -> list[Container]:
    found = client.containers.list(all=True, filters={"label": f"{LABEL_CLUSTER}={name}"})
    return sorted(found, key=lambda c: _node_order(c.labels.get(LABEL_NODE, "")))


def _node_order(hostname: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", hostname)
    return (int(digits) if digits else 0, hostname)


def _taken_subnets(client: docker.DockerClient) -> list[ipaddress.IPv4Network]:
    taken = []
    for net in client.networks.list():
        for conf in (net.attrs.get("IPAM") or {}).get("Config") or []:
            try:
                taken.append(ipaddress.ip_network(conf.get("Subnet", ""), strict=False))
            except ValueError:
                continue
    return [n for n in taken if n.version == 4]


def _ensure_keypair(directory: Path, name: str) -> Path:
    key = directory / "id_ed25519"
    if not key.exists():
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"pycli-local-{name}", "-f", str(key)],
            check=True,
        )
    return key


def _exec(container: Container, *argv: str) -> tuple[int, str]:
    from pycli.local.dockerapi import run_in

    code, output = run_in(container.name, argv)
    return code, output.strip()


def _wait_booted(container: Container, hostname: str) -> None:
    """Wait until systemd has finished booting and sshd has its host keys."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    state = "unknown"
    while time.monotonic() < deadline:
        container.reload()
        if container.status != "running":
            from pycli.local.host_limits import why_stopped

            log = container.logs(tail=5).decode(errors="replace")
            raise PycliError(f"node {hostname} stopped while booting: {why_stopped(log)}")
        code, state = _exec(container, "systemctl", "is-system-running")
        if state in ("running", "degraded"):
            ok, _ = _exec(container, "systemctl", "is-active", "ssh")
            if ok == 0:
                return
        time.sleep(1)
    raise PycliError(f"node {hostname} did not finish booting within {BOOT_TIMEOUT_S} s (systemd says {state!r})")


def _host_keys(container: Container, hostname: str) -> list[str]:
    code, out = _exec(container, "sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub")
    keys = [line.split()[:2] for line in out.splitlines() if line.strip()]
    if code != 0 or not keys:
        raise PycliError(f"node {hostname} has no SSH host keys: {out}")
    return [" ".join(k) for k in keys]


def _has_cgroup_tree(container: Container) -> bool:
    """Whether the node booted with its own cgroup tree for Slurm (the image's pycli-cgroup-tree):
    on a cgroup v1 host, every controller Slurm uses; on a v2 host, none."""
    from pycli.local.image import CGROUP_TREE_MOUNTPOINT

    code, _ = _exec(container, "test", "-e", f"{CGROUP_TREE_MOUNTPOINT}/complete")
    return code == 0


def _install_authorized_key(container: Container, public_key: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo(".ssh")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(folder)
        data = (public_key.strip() + "\n").encode()
        entry = tarfile.TarInfo(".ssh/authorized_keys")
        entry.size, entry.mode = len(data), 0o600
        tar.addfile(entry, io.BytesIO(data))
    if not container.put_archive("/root", buffer.getvalue()):
        raise PycliError(f"could not install the controller key on {container.name}")


def _ping_all(inventory: Path) -> runner.RunResult:
    request = runner.RunRequest(inventory=inventory, pattern=NODES_GROUP, module="ping")
    return runner.run(request, new_run_dir("cluster-up"))


def up(
    name: str,
    count: int,
    *,
    slots: int = LOCAL_NODE_SLOTS,
    subnet: str | None = None,
    image: ImageSpec = ImageSpec(),
    inventory: Path | None = None,
    opt_in: Sequence[str] = (),
    say: Callable[[str], None] = print,
) -> Path:
    """Start the cluster (or find it already up) and return the path of its inventory."""
    validate_name(name)
    validate_node_count(count)
    validate_slots(slots)
    asked_subnet = parse_subnet(subnet) if subnet else None
    inventory = inventory or default_inventory_path(name)
    with cluster_lock(name):
        check_inventory_owner(inventory, _read_if_there(inventory), name)
        return _up(name, count, slots, asked_subnet, image, inventory, opt_in, say)


def _up(name: str, count: int, slots: int, asked_subnet: ipaddress.IPv4Network | None, image: ImageSpec,
        inventory: Path, opt_in: Sequence[str], say: Callable[[str], None]) -> Path:
    from pycli.local import dockerapi

    client = dockerapi.connect()
    existing = _cluster_containers(client, name)
    if existing:
        running = [c for c in existing if c.status == "running"]
        recorded = existing[0].labels.get(LABEL_INVENTORY)
        if len(existing) == count == len(running) and recorded and Path(recorded).exists():
            say(f"cluster {name!r} is already up ({count} nodes); inventory: {recorded}")
            return Path(recorded)
        raise BadInput(
            f"cluster {name!r} already exists with {len(running)} of {len(existing)} nodes running; "
            f"run 'pycli cluster down --name {name}' first, or choose another --name"
        )
    from docker.errors import NotFound

    try:
        client.networks.get(network_name(name))
        raise BadInput(f"docker network {network_name(name)} already exists; remove it or choose another --name")
    except NotFound:
        pass
    try:  # a volume left there would bring its files (a Slurm state, say) into the new cluster
        client.volumes.get(shared_volume_name(name))
        raise BadInput(f"docker volume {shared_volume_name(name)} already exists; remove it "
                       f"('pycli cluster down --name {name}' does) or choose another --name")
    except NotFound:
        pass
    if asked_subnet:
        chosen = asked_subnet
        if any(chosen.overlaps(other) for other in _taken_subnets(client)):
            raise BadInput(f"--subnet {chosen} overlaps a docker network that exists; choose another")
    else:
        chosen = pick_subnet(name, _taken_subnets(client))
    plan = plan_cluster(name, count, chosen, slots, opt_in)
    clashes = [n.container for n in plan.nodes if client.containers.list(all=True, filters={"name": f"^/{n.container}$"})]
    if clashes:
        raise BadInput(f"containers already named {', '.join(clashes)} exist; remove them or choose another --name")

    from pycli.local import host_limits

    if short := host_limits.check_room_for(count):
        raise BadInput("\n".join(short))
    tag = ensure_image(client, image, say=say)
    secrets = cluster_state_dir(name)
    made_secrets = not secrets.exists()
    try:
        return _create(client, plan, tag, secrets, inventory, image, say)
    except BaseException:
        say(f"cluster {name!r} did not come up; removing what was made")
        _remove(client, name, inventory, secrets if made_secrets else None)
        raise


def _create(client: docker.DockerClient, plan: ClusterPlan, tag: str, secrets: Path, inventory: Path, image: ImageSpec,
            say: Callable[[str], None]) -> Path:
    import docker

    started = time.monotonic()
    key = _ensure_keypair(secrets, plan.name)
    labels = {LABEL_CLUSTER: plan.name}
    gateway = str(next(plan.subnet.hosts()))
    client.networks.create(
        plan.network,
        driver="bridge",
        ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(plan.subnet), gateway=gateway)]),
        labels=labels,
    )
    shared = client.volumes.create(name=shared_volume_name(plan.name), labels=labels).name
    say(f"network {plan.network} ({plan.subnet}), shared volume {shared} at {SHARED_DIR}; "
        f"starting {len(plan.nodes)} nodes from {tag}")
    containers: list[tuple[NodePlan, Container]] = []
    for node in plan.nodes:
        host_config = client.api.create_host_config(
            # SYS_ADMIN for systemd; NET_ADMIN so a test can slow a node's link (tc), as a bad cable would;
            # SYS_PTRACE because Docker's seccomp profile refuses process_vm_readv without it, and Open MPI's
            # shared-memory single copy (CMA) between a node's ranks needs that call, as on a server;
            # SYS_NICE because slurmstepd (root) binds a job's processes to their CPUs after they became the
            # job's user's, which root may do only with it: without it a job of any user but root never starts.
            cap_add=["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE", "SYS_NICE"],
            binds=["/sys/fs/cgroup:/sys/fs/cgroup:rw"],
            cgroupns="host",
            # A node's stand-in GPUs (role slurm's slurm_standin_gpus) may be opened where Slurm lets a job,
            # as a GPU container's devices are; nothing is behind them (ENXIO). One rule per device, not
            # 195:*: Slurm denies a job the others one by one, which cgroup v1 cannot take out of a wildcard.
            device_cgroup_rules=[f"c {NVIDIA_MAJOR}:{minor} rwm" for minor in range(STANDIN_GPUS_AT_MOST)],
            tmpfs={"/run": "", "/run/lock": ""},
            # Docker inside a node needs a non-overlay /var/lib/docker; SHARED_DIR is the cluster's one volume.
            mounts=[docker.types.Mount(target="/var/lib/docker", source=None, type="volume"),
                    docker.types.Mount(target=SHARED_DIR, source=shared, type="volume")],
        )
        networking = client.api.create_networking_config(
            {plan.network: client.api.create_endpoint_config(ipv4_address=node.address, aliases=[node.hostname])}
        )
        created = client.api.create_container(
            tag,
            name=node.container,
            hostname=node.hostname,
            labels={**labels, LABEL_NODE: node.hostname, LABEL_INVENTORY: str(inventory.resolve())},
            host_config=host_config,
            networking_config=networking,
            stop_signal="SIGRTMIN+3",
            detach=True,
        )
        container = client.containers.get(created["Id"])
        container.start()
        containers.append((node, container))

    known_hosts_lines = []
    public_key = key.with_suffix(".pub").read_text()
    for node, container in containers:
        _wait_booted(container, node.hostname)
        _install_authorized_key(container, public_key)
        for host_key in _host_keys(container, node.hostname):
            known_hosts_lines.append(f"{node.hostname},{node.address} {host_key}")
    known_hosts = secrets / "known_hosts"
    write_text_atomically(known_hosts, "\n".join(known_hosts_lines) + "\n", force=True, mode=0o600)
    cgroup_tree = all(_has_cgroup_tree(container) for _, container in containers)
    write_text_atomically(inventory, render_local_inventory(plan, key, known_hosts, image.ca_bundle,
                                                            cgroup_tree=cgroup_tree), force=True)

    result = _ping_all(inventory)
    missing = [n.hostname for n in plan.nodes if n.hostname not in result.hosts or result.hosts[n.hostname].ok == 0]
    if missing:
        detail = "; ".join(f"{h}: {' '.join(result.hosts[h].messages)}" for h in missing if h in result.hosts)
        raise Unreachable(f"Ansible could not reach {', '.join(missing)} over SSH ({detail or 'no answer'}); "
                          f"see {result.run_dir}")
    say(f"cluster {plan.name!r} is up in {time.monotonic() - started:.0f} s: "
        f"{', '.join(n.hostname for n in plan.nodes)} answer Ansible over SSH; inventory: {inventory}")
    return inventory


def _remove(client: docker.DockerClient, name: str, inventory: Path | None, secrets: Path | None) -> list[str]:
    from docker.errors import APIError, NotFound

    containers = _cluster_containers(client, name)
    for container in containers:
        recorded = container.labels.get(LABEL_INVENTORY)
        if recorded and inventory is None:
            inventory = Path(recorded)
    # Side by side: the engine spends most of a node's removal deleting its files (the node's
    # own Docker storage included). The test suite's two clusters: 35 s one after another, 23 s
    # side by side (in the later run the job image inside the nodes was smaller too).
    with ThreadPoolExecutor(max_workers=REMOVE_AT_ONCE) as pool:
        list(pool.map(lambda container: container.remove(force=True, v=True), containers))
    removed = [container.name for container in containers]
    for net in client.networks.list(filters={"label": f"{LABEL_CLUSTER}={name}"}):
        with contextlib.suppress(NotFound, APIError):
            net.remove()
    for volume in client.volumes.list(filters={"label": f"{LABEL_CLUSTER}={name}"}):  # SHARED_DIR's
        with contextlib.suppress(NotFound, APIError):
            volume.remove(force=True)
    text = _read_if_there(inventory) if inventory else None
    if inventory and text and INVENTORY_MARKER in text and inventory_owner(text) == name:
        inventory.unlink()
        forget_drained(name, inventory)  # a new cluster there starts with none drained
    if secrets and secrets.exists():
        shutil.rmtree(secrets)
    return removed


def down(name: str, *, say: Callable[[str], None] = print) -> None:
    validate_name(name)
    from pycli.local import dockerapi

    with cluster_lock(name):
        client = dockerapi.connect()
        had_network = bool(client.networks.list(filters={"label": f"{LABEL_CLUSTER}={name}"}))
        removed = _remove(client, name, None, cluster_state_dir(name))
        for folder in cluster_role_state_dirs(name):  # a cluster made again under this name gets new ones
            shutil.rmtree(folder, ignore_errors=True)
    if removed or had_network:
        say(f"cluster {name!r} removed ({len(removed)} nodes and network {network_name(name)})")
    else:
        say(f"no cluster named {name!r} is up; nothing to remove")


@dataclass(frozen=True)
class NodeStatus:
    cluster: str
    hostname: str
    container: str
    state: str
    address: str
    inventory: str


def status(name: str | None = None) -> list[NodeStatus]:
    from pycli.local.dockerapi import connect

    client = connect()
    label = f"{LABEL_CLUSTER}={name}" if name else LABEL_CLUSTER
    rows = []
    for container in client.containers.list(all=True, filters={"label": label}):
        networks = container.attrs.get("NetworkSettings", {}).get("Networks", {}) or {}
        address = next((n.get("IPAddress") for n in networks.values() if n.get("IPAddress")), "")
        rows.append(
            NodeStatus(
                cluster=container.labels[LABEL_CLUSTER],
                hostname=container.labels.get(LABEL_NODE, ""),
                container=container.name,
                state=container.status,
                address=address or "-",
                inventory=container.labels.get(LABEL_INVENTORY, ""),
            )
        )
    return sorted(rows, key=lambda r: (r.cluster, _node_order(r.hostname)))


def running_clusters() -> dict[str, Path]:
    """Local clusters whose nodes all run, with their inventories (for commands' defaults)."""
    clusters: dict[str, list[NodeStatus]] = {}
    for row in status():
        clusters.setdefault(row.cluster, []).append(row)
    return {
        name: Path(rows[0].inventory)
        for name, rows in clusters.items()
        if all(r.state == "running" for r in rows) and rows[0].inventory and Path(rows[0].inventory).exists()
    }
