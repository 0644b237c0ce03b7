"""The plan of a local cluster, before anything is made: names, addresses, its inventory.

Pure: `plan_cluster` names every node, container and address from the cluster's name, node
count and subnet, and `render_local_inventory` writes the plain, commented inventory that
`pycli cluster up` (pycli/local/cluster.py, the Docker side) leaves for the user to read.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pycli.cluster.inventory_writer import HostEntry, render_inventory
from pycli.cluster.model import INTERFACE_VAR, LOCAL_CLUSTER_VAR, SHARED_CPUS_VAR
from pycli.core.errors import BadInput, PycliError
from pycli.core.paths import state_dir
from pycli.local.image import CGROUP_TREE_MOUNTPOINT

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,22}[a-z0-9])?$")
MAX_NODES = 64
# Ranks per local container node by default: `pycli train --np 8` fills two nodes, and the
# workloads split the machine's cores between the ranks of a node. Not the slots of an
# inventory host that names none (cluster_model.DEFAULT_SLOTS).
LOCAL_NODE_SLOTS = 4
# Local clusters get a /24 each out of this block, picked from the cluster's name.
SUBNET_POOL = ipaddress.IPv4Network("172.28.0.0/16")
FIRST_NODE_OFFSET = 10
# A subnet the user names: IPv4 (Docker's bridge and the inventory speak IPv4 here), no larger
# than a /16 and no smaller than a /28 (16 addresses: the gateway, the offset, a few nodes).
SUBNET_PREFIXES = range(16, 29)
INVENTORY_HEADER = "pycli local cluster"
INVENTORY_MARKER = f"# {INVENTORY_HEADER}"
# The variable of a local cluster's inventory that names the cluster it belongs to.
OWNER_VARIABLE = LOCAL_CLUSTER_VAR
_OWNER_LINE = re.compile(rf"^{OWNER_VARIABLE}=(['\"]?)([^'\"\s]+)\1\s*$", re.MULTILINE)


@dataclass(frozen=True)
class NodePlan:
    hostname: str
    container: str
    address: str


@dataclass(frozen=True)
class ClusterPlan:
    name: str
    network: str
    subnet: ipaddress.IPv4Network
    nodes: tuple[NodePlan, ...]
    slots: int = LOCAL_NODE_SLOTS
    # Opt-in groups (inventory_writer.OPT_IN_GROUPS) that name the first node: slurm_controller (provisioning
    # adds Slurm), monitoring (Prometheus and node-exporter).
    opt_in: tuple[str, ...] = ()


def validate_name(name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise BadInput(
            f"cluster name {name!r} must be 1-24 lower-case letters, digits or '-', "
            "starting and ending with a letter or digit"
        )


def validate_node_count(count: int) -> None:
    if not 1 <= count <= MAX_NODES:
        raise BadInput(f"--nodes must be between 1 and {MAX_NODES}, got {count}")


def validate_slots(slots: int) -> None:
    if slots < 1:
        raise BadInput(f"--slots must be 1 or more processes per node, got {slots}")


def default_inventory_path(name: str) -> Path:
    """Where `cluster up` writes a local cluster's inventory unless told: inventory/ under the
    current folder, beside the user's files as the run folders are (in a checkout, its own
    inventory/, which ansible.cfg names)."""
    return Path.cwd() / "inventory" / f"local-{name}.ini"


def cluster_state_dir(name: str) -> Path:
    return state_dir() / "clusters" / name


# What the roles keep per cluster under $PYCLI_STATE, in a folder named after a local cluster
# (pycli_local_cluster; roles/ssh_trust's ssh_trust_key_dir, roles/slurm's slurm_secret_dir).
ROLE_STATE_DIRS = ("ssh_trust", "slurm")


def cluster_role_state_dirs(name: str) -> list[Path]:
    """The cluster key pair and Slurm's secrets the roles made for local cluster `name`: `cluster down` removes them."""
    return [state_dir() / role / name for role in ROLE_STATE_DIRS]


def cluster_lock_path(name: str) -> Path:
    """The lock `cluster up` and `cluster down` hold while they change cluster `name`.

    Beside the cluster's state folder, not in it: `down` removes that folder, and a lock
    file must outlive its holders to keep them apart."""
    return state_dir() / "locks" / f"cluster-{name}.lock"


def inventory_owner(text: str) -> str | None:
    """The local cluster an inventory belongs to, as its own variable says (None: no cluster)."""
    found = _OWNER_LINE.search(text)
    return found.group(2) if found else None


def check_inventory_owner(path: Path, text: str | None, name: str) -> None:
    """Cluster `name` may write (and later remove) the inventory at `path`, whose text is `text`
    (None: there is no file): only its own, never a file of another cluster or of a person."""
    if text is None:
        return
    if INVENTORY_MARKER not in text:
        raise BadInput(f"{path} exists and was not written by pycli; pass another --output")
    owner = inventory_owner(text)
    if owner != name:
        whose = f"of local cluster {owner!r}" if owner else "of a local cluster it does not name"
        raise BadInput(f"{path} is the inventory {whose}; pass another --output for cluster {name!r}")


def network_name(name: str) -> str:
    return f"pycli-{name}"


# A folder every node of a local cluster mounts, one Docker volume, as a real cluster's nodes mount
# one NFS share: where a backup Slurm controller's state goes (slurm_state_save_location), say.
SHARED_DIR = "/srv/shared"


def shared_volume_name(name: str) -> str:
    """The Docker volume behind SHARED_DIR on every node of local cluster `name`."""
    return f"pycli-{name}-shared"


def container_name(name: str, hostname: str) -> str:
    """The Docker container of node `hostname` of local cluster `name`."""
    return f"pycli-{name}-{hostname}"


def pick_subnet(name: str, taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first free /24 of the pool, starting at a place fixed by the cluster's name."""
    blocks = list(SUBNET_POOL.subnets(new_prefix=24))
    start = int(hashlib.sha256(name.encode()).hexdigest(), 16) % len(blocks)
    for i in range(len(blocks)):
        block = blocks[(start + i) % len(blocks)]
        if not any(block.overlaps(other) for other in taken):
            return block
    raise PycliError(f"no free /24 left in {SUBNET_POOL} for a new local cluster; pass --subnet")


def _check_subnet(text: str, subnet: ipaddress.IPv4Network | ipaddress.IPv6Network) -> None:
    if subnet.version != 4:
        raise BadInput(f"--subnet {text!r}: IPv4 only, e.g. 172.28.7.0/24")
    if subnet.prefixlen not in SUBNET_PREFIXES:
        raise BadInput(f"--subnet {text!r}: a prefix from /{SUBNET_PREFIXES[0]} to /{SUBNET_PREFIXES[-1]}, "
                       f"not /{subnet.prefixlen}")


def parse_subnet(text: str) -> ipaddress.IPv4Network:
    """The --subnet a user gave: an IPv4 network of bounded size, or BadInput in one line."""
    try:
        subnet = ipaddress.ip_network(text)
    except ValueError as exc:
        raise BadInput(f"--subnet {text!r}: {exc}") from None
    _check_subnet(text, subnet)
    assert isinstance(subnet, ipaddress.IPv4Network)  # _check_subnet refused IPv6
    return subnet


def plan_cluster(name: str, count: int, subnet: ipaddress.IPv4Network, slots: int = LOCAL_NODE_SLOTS,
                 opt_in: Sequence[str] = ()) -> ClusterPlan:
    """Names and addresses of every node: pure, so it can be checked before anything is made."""
    validate_name(name)
    validate_node_count(count)
    validate_slots(slots)
    _check_subnet(str(subnet), subnet)
    if subnet.num_addresses < FIRST_NODE_OFFSET + count + 2:
        raise BadInput(f"subnet {subnet} is too small for {count} nodes")
    # Counted from the network's address, never by listing the subnet's hosts.
    nodes = tuple(
        NodePlan(hostname=f"node{i}", container=container_name(name, f"node{i}"),
                 address=str(subnet.network_address + FIRST_NODE_OFFSET + i))
        for i in range(1, count + 1)
    )
    return ClusterPlan(name=name, network=network_name(name), subnet=subnet, nodes=nodes, slots=slots,
                       opt_in=tuple(opt_in))


# What the local test bed needs beyond the role defaults: these nodes are containers on a
# machine that may reach only PyPI and the Debian mirror (the settings a user behind a
# firewall makes too). Open MPI is Debian's copy of the upstream 4.1.4 tarball; its sha256
# is the one in the Checksums-Sha256 of Debian's signed openmpi_4.1.4-3.dsc.
LOCAL_BED_VARS: dict[str, object] = {
    "openmpi_version": "4.1.4",
    "openmpi_source_url": "http://deb.debian.org/debian/pool/main/o/openmpi/openmpi_4.1.4.orig.tar.xz",
    "openmpi_source_sha256": "ddaee7dbdb01eb4fab1fda5b5e03e8bbff026711806c095c1f39bb410f99f263",
    "docker_package_source": "distribution",
    # Docker inside a node container: no iptables rules and no bridge (the node's network is
    # the test bed's), and containers start through the image's runc wrapper
    # (roles/pycli_node/files/pycli_node/runc-nested).
    "docker_daemon_options": {
        "iptables": False, "ip6tables": False, "bridge": "none",
        "runtimes": {"runc-nested": {"path": "/usr/local/bin/runc-nested"}},
        "default-runtime": "runc-nested",
    },
    # That wrapper keeps a container in its node's network namespace, which is what
    # `--network host` gives on real hosts; here Docker itself cannot set up a host network,
    # so job containers get the node's name and address as a host network would give them.
    "pycli_job_container_network": "none",
    "pycli_job_container_options": [
        "--hostname", "{{ inventory_hostname }}", "--add-host", "{{ inventory_hostname }}:{{ ansible_host }}",
    ],
    # The nodes share this machine's cores: measured at once they would measure the scheduler.
    SHARED_CPUS_VAR: True,
    # One Open MPI build for the bed's clusters with and without Slurm: built against Slurm's PMI-2
    # (real inventories: only where they have Slurm, openmpi_with_pmi auto).
    "openmpi_with_pmi": True,
    # Nothing on the bed uses OpenSHMEM, MPI-IO (ROMIO, and ompio with its frameworks), message
    # logging (vprotocol) or topology-aware rank reordering (topo-treematch): without them the cold
    # build compiles about 600 fewer of Open MPI's C files, and the rest in about 10 % less time
    # (roles/openmpi/defaults/main.yml has the figures).
    "openmpi_configure_extra_flags": ["--disable-oshmem", "--disable-io-romio",
                                      "--enable-mca-no-build=io,fcoll,fbtl,fs,sharedfp,vprotocol,topo-treematch"],
    # No CUDA on the bed, ever: said outright, the Open MPI build starts right after the base
    # system instead of waiting for the GPU stack to say so (site.yml; the flags are the same).
    "openmpi_with_cuda": False,
    # Slurm (role slurm, with --slurm): Slurm's cgroup plugins only where the nodes have their own
    # cgroup tree (CGROUP_TREE_VARS); each node runs `slots` ranks on the machine's shared cores.
    "slurm_cgroup": False,
    "slurm_node_cpus": "{{ slots }}",
    # A job that names no memory gets this much per CPU, not the node's whole memory: jobs share a
    # node as they do on servers with the same setting (docs/slurm.md, "What the local test bed changes").
    "slurm_extra_config": {"DefMemPerCPU": 2048},
    "slurm_slurmd_parameters": ["config_overrides"],
    # Slurm's health check every 20 s rather than 5 min: a planted fault drains a node within a test.
    "slurm_health_check_interval": 20,
    # A backup slurmctld (a second host in group slurm_controller) takes over after 10 s, not 120.
    "slurm_ctld_timeout": 10,
}
LOCAL_BED_COMMENTS = {
    "openmpi_version": "Test bed: Open MPI from Debian's mirror (see pycli/local/plan.py for the checksum's source).",
    "docker_package_source": ("Test bed: Docker from Debian; nodes are containers, so Docker runs without iptables "
                              "or a bridge, containers through the image's runc wrapper."),
    "common_extra_ca_bundle": "Test bed: the CA bundle baked into the node image, trusted by pip on the nodes too.",
    "pycli_job_container_network": "Test bed: train --docker containers stay in their node's network (real hosts: host).",
    "pycli_job_container_options": "Test bed: what a host network gives a container, its node's name and address.",
    SHARED_CPUS_VAR: "Test bed: the nodes share this machine's cores, so check --deep measures one node or pair at a time.",
    "openmpi_with_pmi": ("Test bed: one Open MPI build for clusters with and without Slurm, against Slurm's PMI-2 "
                         "(real inventories: only those with Slurm)."),
    "openmpi_configure_extra_flags": ("Test bed: Open MPI without OpenSHMEM, MPI-IO, message logging and "
                                      "topology-aware reordering, which nothing here uses."),
    "openmpi_with_cuda": "Test bed: no CUDA, so the Open MPI build starts before the GPU stack's plays.",
    "slurm_cgroup": ("Test bed: Slurm's cgroup plugins where the nodes have their own cgroup tree (cgroup v1 hosts), "
                     "`slots` CPUs per node, slurmd registering with slurm.conf's figures (config_overrides)."),
    "slurm_cgroup_config": ("Test bed: the node's own cgroup tree, made at boot (the image's pycli-cgroup-tree); "
                            "no core confinement, the nodes' slots being more than the machine's cores."),
    "slurm_extra_config": "Test bed: a job that names no memory gets 2 GiB per CPU, not the whole node's.",
    "slurm_health_check_interval": "Test bed: Slurm's health check (pycli's node gate) every 20 s, not 5 min.",
    "slurm_ctld_timeout": ("Test bed: a backup Slurm controller takes over after 10 s without the primary, not 120; "
                           f"its state folder, slurm_state_save_location, goes under {SHARED_DIR}, which every node shares."),
}


# Where the nodes booted with their own cgroup v1 tree (the node image's pycli-cgroup-tree, at every
# boot; a cgroup v2 host gives none): Slurm's cgroup plugins confine each job there to its memory
# and GPUs, as on a server. Not its cores: each node's slots share the machine's few.
CGROUP_TREE_VARS: dict[str, object] = {
    "slurm_cgroup": True,
    "slurm_cgroup_config": {"CgroupPlugin": "cgroup/v1", "CgroupMountpoint": CGROUP_TREE_MOUNTPOINT,
                            "ConstrainCores": "no"},
}


def render_local_inventory(plan: ClusterPlan, key: Path, known_hosts: Path, ca_bundle: Path | None = None,
                           *, cgroup_tree: bool = False) -> str:
    bed_vars = dict(LOCAL_BED_VARS) | (CGROUP_TREE_VARS if cgroup_tree else {})
    if ca_bundle is not None:
        bed_vars["common_extra_ca_bundle"] = str(ca_bundle.resolve())
    return render_inventory(
        [HostEntry(name=node.hostname, address=node.address) for node in plan.nodes],
        opt_in={group: plan.nodes[0].hostname for group in plan.opt_in},
        header=[
            f"{INVENTORY_HEADER} {plan.name!r}: {len(plan.nodes)} systemd node containers on",
            f"docker network {plan.network} ({plan.subnet}). Written by 'pycli cluster up';",
            f"'pycli cluster down --name {plan.name}' removes the nodes and this file.",
            "Ansible reaches the nodes over real SSH as root with this cluster's own key; the",
            "host keys were read from each node through the Docker API and are always checked.",
            f"Every node mounts one shared folder at {SHARED_DIR} (a Docker volume), as NFS would.",
        ],
        group_vars={
            "ansible_user": "root",
            "ansible_port": 22,
            "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={known_hosts}",
            "slots": plan.slots,
            INTERFACE_VAR: "eth0",
            OWNER_VARIABLE: plan.name,
            **bed_vars,
        },
        var_comments={
            "ansible_ssh_common_args": "Host keys of every node, by name and address.",
            "slots": "Processes per node: these nodes have no GPU; ranks share the machine's cores.",
            INTERFACE_VAR: "The NIC ranks talk over (a node running Docker also has docker0).",
            **LOCAL_BED_COMMENTS,
        },
    )
