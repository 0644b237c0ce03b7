"""The one place that builds launcher command lines: horovodrun, mpirun and torchrun.

A `JobPlan` says what runs where; from it come the command line of each launcher and the
shell line each node runs (in the job's folder, the shared venv first on PATH, or inside
the job's container). Pure: nothing here touches a node.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from pycli.cluster.hostfiles import render_hostfile
from pycli.cluster.model import DEFAULT_SSH_PORT, VENV_VAR, WORK_DIR_VAR, Host
from pycli.core.errors import BadInput
from pycli.core.paths import WORKLOADS_DIR, role_defaults
from pycli.jobs import containers
from pycli.jobs.request import JobRequest

# horovodrun's controllers (--gloo, --mpi): how its ranks find each other and coordinate.
# Not the collective library that moves the tensors (`pycli bench --backends`).
HOROVOD_CONTROLLERS = ("gloo", "mpi")


def check_controller(controller: str) -> str:
    """The controller, or BadInput (exit 2) naming the choices: the one check of --controller."""
    if controller not in HOROVOD_CONTROLLERS:
        raise BadInput(f"unknown --controller {controller!r}; use one of {', '.join(HOROVOD_CONTROLLERS)}")
    return controller


# How a job starts: horovodrun, mpirun (Horovod's MPI controller) or torchrun (one per node).
LAUNCHERS = ("horovod", "mpirun", "torchrun")
ALLREDUCE_SCRIPT = WORKLOADS_DIR / "allreduce.py"  # the allreduce of check's gate and bench's microbenchmark
# torchrun's rendezvous port when none was picked on the first node (plans shown, not run):
# a job that runs over SSH asks its first node for a free port while it is staged; through
# Slurm the batch script picks the job's own (pycli.jobs.slurm.RENDEZVOUS_PORTS) as it starts.
TORCHRUN_PORT = 29400
# torchrun --elastic without --elastic-restarts: how often its agents start the ranks again.
DEFAULT_ELASTIC_RESTARTS = 3
# The threads of each rank: torch, OpenMP and MKL read it; torchrun keeps a value it is given.
THREADS_VAR = "OMP_NUM_THREADS"
# The GPUs a process may see, by index: CUDA reads it, Slurm sets it for a job's GPUs.
GPUS_VAR = "CUDA_VISIBLE_DEVICES"
# Horovod's run settings for jobs on nodes without GPUs (horovodrun and mpirun); --env
# overrides them. Chosen by measurement (docs/bench.md): Horovod's background thread runs a
# round of coordination between the ranks every cycle (1 ms by default), busy or not, and on
# CPUs that round takes cores from the ranks' compute. On GPUs Horovod's defaults stay (not measured).
HOROVOD_CPU_ENV: tuple[str, ...] = ("HOROVOD_CYCLE_TIME=5",)
AUTOTUNE_LOG = "autotune.csv"
# Rank 0's metrics records, one JSON line each, in the job's folder (what train reports).
METRICS_FILE = "metrics.jsonl"
# torchrun --elastic: the ranks keep their own store, not the agents' rendezvous store, whose
# keys outlive a restart (torch 2.5 and later): a restarted rank would read the address an
# earlier rank 0 had and fail to connect (pytorch/pytorch#135712).
TORCHRUN_ELASTIC_ENV = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",)


def _common_default(name: str) -> PurePosixPath:
    """The common role's default for a node path (its home: roles/common/defaults/main.yml)."""
    return PurePosixPath(str(role_defaults("common")[name]))


@dataclass(frozen=True)
class NodeLayout:
    """Where the roles put things on every node (role defaults, overridable in the inventory)."""

    venv: PurePosixPath = field(default_factory=lambda: _common_default(VENV_VAR))
    work_dir: PurePosixPath = field(default_factory=lambda: _common_default(WORK_DIR_VAR))

    @classmethod
    def from_settings(cls, settings: Mapping[str, object]) -> NodeLayout:
        """The layout an inventory's settings give: its own venv and work folder, else the role's."""
        return cls(
            venv=PurePosixPath(str(settings.get(VENV_VAR) or _common_default(VENV_VAR))),
            work_dir=PurePosixPath(str(settings.get(WORK_DIR_VAR) or _common_default(WORK_DIR_VAR))),
        )

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def tool(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    @property
    def jobs_dir(self) -> PurePosixPath:
        """Every job's folder is in here, named by its job id (JobPlan.job_dir)."""
        return self.work_dir / "jobs"

    @property
    def store(self) -> PurePosixPath:
        """Staged files by the digest of their content (pycli.jobs.files): data is read from here."""
        return self.work_dir / "files"


@dataclass(frozen=True)
class JobPlan:
    """A job decided down to its hosts and paths (pycli.jobs.train.plan_job makes it from a JobRequest).

    The request travels whole in `request`: what the caller asked for is read there (its
    controller, script arguments, container, threads, --env, --autotune), and only what
    planning decided, or a restart changes, sits beside it."""

    request: JobRequest
    job_id: str
    launcher: str  # one of LAUNCHERS: the request's, or its workload's usual one
    np: int  # the request's --np; a restart may go on with fewer (pycli/jobs/restarts.py)
    hosts: tuple[Host, ...]
    script: Path  # on the controller: the workload's script
    layout: NodeLayout
    network_interface: str | None = None  # the request's, else the inventory's
    data_dir: Path | None = None  # on the controller; only for a workload that reads data
    resume: Path | None = None  # on the controller: the request's checkpoint, until a restart resumes on the nodes
    rendezvous_port: int | None = None  # torchrun: a port found free on the first node while staging
    resume_on_node: PurePosixPath | None = None  # a restart (--max-restarts): the checkpoint already on the nodes
    elastic_min_np: int | None = None  # --elastic: the launcher's elastic mode, going on with at least this many ranks
    data_digest: str | None = None  # the data's name in the nodes' store (pycli.jobs.files.content_digest)
    jobs_kept: int = 20  # pycli_jobs_kept: job folders (and store entries) a node keeps; 0: all
    nodes_share_cpus: bool = False  # the inventory's pycli_nodes_share_cpus: every rank of the job shares one machine
    node_cpus: tuple[tuple[str, int], ...] = ()  # (host, its cores) as staging counted them; () before staging
    node_gpus: tuple[tuple[str, int], ...] = ()  # (host, its GPUs) as staging counted them; () before staging
    slurm: bool = False  # through Slurm's queue (the request's --scheduler, or the inventory's default), not over SSH
    @property
    def job_dir(self) -> PurePosixPath:
        return self.layout.jobs_dir / self.job_id

    @property
    def python(self) -> str:
        # In a container, the image's own interpreter and tools, found on its PATH.
        return "python3" if self.request.container else self.layout.python

    def tool(self, name: str) -> str:
        return name if self.request.container else self.layout.tool(name)

    @property
    def ssh_ports(self) -> set[int]:
        """The ports horovodrun and mpirun reach the job's hosts on (the containers' sshd)."""
        if self.request.container is None:
            return {h.port for h in self.hosts}
        # Through Slurm without --docker-ssh-port the port is the job's own, known as it starts: the
        # containers' ssh config names it (job-container.sh), and the launchers are told none.
        port = self.request.container.port(self.slurm)
        return set() if port is None else {port}

    @property
    def remote_script(self) -> PurePosixPath:
        return self.job_dir / "workloads" / self.script.name

    @property
    def rank0(self) -> Host:
        return self.hosts[0]

    @property
    def restarts_by_agents(self) -> bool:
        """torchrun --elastic: its agents restart the ranks and carry on without a lost node, not pycli."""
        return self.launcher == "torchrun" and self.elastic_min_np is not None

    @property
    def elastic_restarts(self) -> int:
        """torchrun --elastic: how often its agents start the ranks again (--elastic-restarts); else 0."""
        if not self.restarts_by_agents:
            return 0
        asked = self.request.recovery.elastic_restarts
        return DEFAULT_ELASTIC_RESTARTS if asked is None else asked

    @property
    def ranks_by_rendezvous(self) -> bool:
        """torchrun's c10d rendezvous numbers the nodes (by their addresses), not the plan: rank 0 may
        run on another node than the plan's first (under --elastic, and through Slurm)."""
        return self.launcher == "torchrun" and (self.restarts_by_agents or self.slurm) and len(self.hosts) > 1

    @property
    def logins_as_steps(self) -> bool:
        """horovodrun through Slurm, on the nodes themselves: it starts the ranks of every node but
        its own with `ssh`, and each such login must become a step of the job (slurm_ssh_script)."""
        return self.slurm and self.launcher == "horovod" and not self.request.container

    @property
    def slurm_ssh_dir(self) -> PurePosixPath:
        """logins_as_steps: the folder of the job's own `ssh`, first on horovodrun's PATH."""
        return self.job_dir / "slurm-ssh"

    @property
    def discovery_script(self) -> PurePosixPath:
        """--elastic: the script horovodrun asks which hosts can take ranks now (host_discovery_script)."""
        return self.job_dir / "discover-hosts.sh"


def remote_data_dir(plan: JobPlan) -> PurePosixPath:
    """Data is staged once per content, outside the job, so later jobs read the same copy."""
    assert plan.data_digest, "plan_job names the data by its digest"
    return plan.layout.store / plan.data_digest


def rank_threads(plan: JobPlan, hosts: Sequence[Host] | None = None) -> int | None:
    """CPU threads for each rank on `hosts` (default: all of the job's), set as OMP_NUM_THREADS.

    The request's --threads-per-rank when given; else each node's cores shared out between the ranks it runs
    (every rank of the job when the nodes share one machine's cores), the fewest of `hosts`
    (one launcher line may start the ranks of several nodes); None before staging counted the cores."""
    if plan.request.launch.threads_per_rank:
        return plan.request.launch.threads_per_rank
    if not plan.node_cpus:
        return None
    cpus = dict(plan.node_cpus)
    shares = [cpus[host.name] // (plan.np if plan.nodes_share_cpus else host.slots)
              for host in hosts or plan.hosts if cpus.get(host.name)]
    return max(1, min(shares)) if shares else None


def checkpoint_path(plan: JobPlan) -> PurePosixPath:
    """Where the built-in workloads keep their checkpoint on every node of the job."""
    return plan.job_dir / "checkpoints" / "last.pt"


def workload_args(plan: JobPlan) -> list[str]:
    """The arguments pycli adds for its own workloads: data, checkpoint, metrics, resume."""
    args: list[str] = []
    name = plan.script.name
    if plan.script.parent == WORKLOADS_DIR and name in ("mnist.py", "ddp.py"):
        args += ["--checkpoint", str(checkpoint_path(plan)), "--metrics", str(plan.job_dir / METRICS_FILE)]
        if plan.resume_on_node is not None:
            args += ["--resume", str(plan.resume_on_node)]
        elif plan.resume is not None:
            args += ["--resume", str(plan.job_dir / "resume.pt")]
        if plan.elastic_min_np is not None:
            args.append("--elastic")
    if plan.script.parent == WORKLOADS_DIR and name == "synthetic.py":
        args += ["--metrics", str(plan.job_dir / METRICS_FILE)]
        if plan.launcher == "torchrun":
            args += ["--comm", "ddp"]
    if plan.data_dir is not None:
        args += ["--data-dir", str(remote_data_dir(plan))]
    return args + list(plan.request.launch.script_args)


def _program(plan: JobPlan) -> list[str]:
    return [plan.python, "-u", str(plan.remote_script), *workload_args(plan)]


# The variables that put the sockets of torch's collective libraries on one NIC.
SOCKET_INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def socket_interface_env(interface: str | None) -> list[str]:
    """NAME=VALUE settings that keep Gloo's and NCCL's sockets on `interface` (none without one):
    for every rank pycli starts, the jobs' and the deep check's probes alike."""
    return [f"{name}={interface}" for name in SOCKET_INTERFACE_VARS] if interface else []


def ssh_port_option(ports: set[int]) -> int | None:
    """The SSH port a launcher must be told (it takes one for all hosts); None for the default, or
    for none known (ssh's config names it)."""
    return None if not ports or ports == {DEFAULT_SSH_PORT} else min(ports)


# The interface that holds 127.0.0.1 on Linux: an elastic horovodrun job on its own node talks over it.
LOOPBACK_INTERFACE = "lo"
# How long a host that does not answer holds up horovodrun's host discovery (--elastic).
DISCOVERY_CONNECT_TIMEOUT_S = 3


def host_discovery_script(plan: JobPlan) -> str:
    """The script horovodrun --elastic runs on the launcher node, again and again: `address:slots`
    for every host of the job that answers SSH now, in the job's host order. A lost node drops
    out; one that comes back is taken in again, up to --np ranks."""
    # Through Slurm, the system's ssh (`command -p`), not the job's own (slurm_ssh_script), which
    # would wait for a lost node as long as Slurm does.
    ssh = "command -p ssh" if plan.logins_as_steps else "ssh"
    lines = [
        "#!/bin/bash",
        f"# pycli job {plan.job_id}: the hosts that can take ranks now (horovodrun --host-discovery-script).",
        "found=$(mktemp -d) || exit 1",
        "trap 'rm -rf \"$found\"' EXIT",
        "probe() {",
        f"    {ssh} -o BatchMode=yes -o ConnectTimeout={DISCOVERY_CONNECT_TIMEOUT_S} -p \"$2\" \"$3\" true "
        "</dev/null >/dev/null 2>&1 && echo \"$3:$4\" >\"$found/$1\"",
        "}",
        *(f"probe {i:05d} {host.port} {shlex.quote(host.address)} {host.slots} &" for i, host in enumerate(plan.hosts)),
        "wait",
        "cat \"$found\"/* 2>/dev/null",
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


# The job's own ssh asks again for a step Slurm could not create, this often, this far apart.
STEP_TRIES = 30
STEP_PAUSE_S = 2
# The options of OpenSSH's client that take a value (ssh(1)): the job's own ssh skips them.
SSH_VALUE_OPTIONS = "BbcDEeFIiJLlmOoPpQRSWw"


def slurm_ssh_script(plan: JobPlan) -> str:
    """The job's own `ssh` through Slurm (JobPlan.logins_as_steps): a login horovodrun makes to a
    node of the job runs its command as a step of the job there (`srun --overlap`, one task),
    so the ranks it starts run inside the job's allocation, with its GPUs and memory only and
    accounted by sacct, not beside it as a login would. The host is the job's node by the
    address horovodrun's -H names it by, or by its Slurm name (horovodrun --mpi); ssh's own
    options are skipped; the command is the rest of the words, joined as ssh joins them."""
    cases = "".join(f"    {'|'.join(shlex.quote(name) for name in dict.fromkeys((host.address, host.name)))}) "
                    f"node={shlex.quote(host.name)} ;;\n" for host in plan.hosts)
    return "\n".join([
        "#!/bin/bash",
        f"# pycli job {plan.job_id}: horovodrun's logins to the job's nodes, each run as a step of its Slurm job.",
        "host=",
        "while [ $# -gt 0 ]; do",
        "    case $1 in",
        f"        -[{SSH_VALUE_OPTIONS}]) shift 2 ;;",
        "        --) shift; [ -z \"$host\" ] && { host=$1; shift; }; break ;;",
        "        -*) shift ;;",
        "        *) [ -n \"$host\" ] && break; host=$1; shift ;;",
        "    esac",
        "done",
        "case ${host#*@} in",
        cases + "    *) echo \"pycli: $host is no node of Slurm job ${SLURM_JOB_ID:-?}\" >&2; exit 255 ;;",
        "esac",
        # A slurmctld that has just restarted creates no step of a running job for a few seconds
        # ("Unable to create step ...: Memory required by task is not available", Slurm 22.05): the
        # rank never started, and the step is asked for again. The first line srun's stderr
        # carries tells (a rank's own stderr passes on as it is).
        # Beside this script, in the job's folder: a login killed before its trap runs leaves it
        # there, and it goes with the folder (not into /tmp for good).
        'first=$(mktemp -p "$(dirname "$0")" .first.XXXXXX) || exit 255',
        'trap \'rm -f "$first"\' EXIT',
        "exec 3>&1",  # srun's stdout as it is; its stderr through awk, which keeps the first line
        # horovodrun ends a login by signalling this shell; srun and awk must end with it (SIGKILL
        # as it goes): an srun left behind, waiting on a node that is gone, keeps the output open and
        # horovodrun waiting until Slurm gives the node up (minutes).
        f"for _ in $(seq {STEP_TRIES}); do",
        '    setpriv --pdeathsig KILL srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap --mpi=none --cpu-bind=none '
        '--quiet bash -c "$*" \\',
        '        2>&1 >&3 3>&- | setpriv --pdeathsig KILL \\',
        '        awk -v f="$first" \'NR == 1 { print > f; close(f) } { print; fflush() }\' >&2 3>&-',
        "    code=${PIPESTATUS[0]}",
        "    [ $code -ne 0 ] && grep -q '^srun: error: Unable to create step' \"$first\" || exit $code",
        '    : >"$first"',
        f"    sleep {STEP_PAUSE_S}",
        "done",
        "exit $code",
    ]) + "\n"


def autotune_log(plan: JobPlan) -> PurePosixPath:
    """Where horovodrun --autotune writes what it tried (fetched into the run's results)."""
    return plan.job_dir / AUTOTUNE_LOG


def horovodrun_argv(plan: JobPlan) -> list[str]:
    argv = [plan.tool("horovodrun"), "-np", str(plan.np)]
    if plan.request.launch.autotune:
        argv += ["--autotune", "--autotune-log-file", str(autotune_log(plan))]
    if plan.elastic_min_np is not None:
        argv += ["--min-np", str(plan.elastic_min_np), "--max-np", str(plan.np),
                 "--host-discovery-script", str(plan.discovery_script)]
    elif plan.logins_as_steps and plan.request.launch.controller == "mpi":
        # Open MPI inside the allocation keeps the hosts of -H that Slurm names (job_mpirun_argv).
        argv += ["-H", render_hostfile(slurm_named(plan.hosts), "horovod").strip()]
    else:
        argv += ["-H", render_hostfile(plan.hosts, "horovod").strip()]
    argv.append("--gloo" if plan.request.launch.controller == "gloo" else "--mpi")
    if (port := ssh_port_option(plan.ssh_ports)) is not None:
        argv += ["-p", str(port)]
    # horovodrun looks the interface up on every host it talks to; with one host that is
    # 127.0.0.1, which has no such interface, and the job fails.
    if plan.network_interface and len(plan.hosts) > 1:
        argv += ["--network-interface", plan.network_interface]
    elif plan.elastic_min_np is not None and len(plan.hosts) == 1:
        # Every rank on the node horovodrun runs on: unless it is given an interface, elastic
        # horovodrun finds one by comparing two hosts, and waits its whole --elastic-timeout
        # (600 s) for a second; the one it would find on one host is the loopback's.
        argv += ["--network-interface", LOOPBACK_INTERFACE]
    return argv + _program(plan)


# Open MPI as pycli runs it, for jobs and for `pycli check`'s mpirun gate alike: no binding
# (each rank sets its own threads), slots filled in host order, TCP with the openib BTL off
# (it probes InfiniBand hardware and warns or hangs where there is none).
MPIRUN_FLAGS = ("-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib")
# What every rank gets from the launching shell (-x): the venv's tools and unbuffered output.
MPIRUN_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONUNBUFFERED=1")


def mpirun_argv(
    mpirun: str, hosts: Sequence[Host], *, np: int, user: str, ssh_ports: set[int], network_interface: str | None,
    tag_output: bool = True,
) -> list[str]:
    """mpirun over `hosts` (each with its slots), with every flag pycli runs Open MPI with; the program follows.

    `tag_output` prefixes each line with its rank, as a job's output wants; a caller that
    compares the lines themselves leaves it off."""
    argv = [mpirun, "-np", str(np), "-H", render_hostfile(hosts, "horovod").strip(), *MPIRUN_FLAGS]
    if tag_output:
        argv.append("--tag-output")
    for variable in MPIRUN_ENV:
        argv += ["-x", variable]
    if user == "root":
        argv.append("--allow-run-as-root")
    if (port := ssh_port_option(ssh_ports)) is not None:
        argv += ["-mca", "plm_rsh_args", f"-p {port}"]
    if network_interface:
        argv += ["-mca", "btl_tcp_if_include", network_interface, "-mca", "oob_tcp_if_include", network_interface]
        for setting in socket_interface_env(network_interface):
            argv += ["-x", setting]
    return argv


def slurm_named(hosts: Sequence[Host]) -> tuple[Host, ...]:
    """The hosts as Open MPI must name them inside a Slurm allocation, where it keeps only the
    hosts of -H the allocation names: by the inventory's names, which are Slurm's (roles/slurm).
    Its daemons start through srun, so the names need not resolve."""
    return tuple(replace(host, address=host.name) for host in hosts)


def job_mpirun_argv(plan: JobPlan, user: str) -> list[str]:
    """The job under mpirun: Horovod with its MPI controller, the ranks started by Open MPI."""
    # In a job container, Open MPI sees no Slurm and starts its daemons over the containers' SSH,
    # as without Slurm.
    hosts = slurm_named(plan.hosts) if plan.slurm and not plan.request.container else plan.hosts
    launch = mpirun_argv("mpirun", hosts, np=plan.np, user=user, ssh_ports=plan.ssh_ports,
                         network_interface=plan.network_interface)
    # remote_shell sets these in mpirun's own environment; -x hands them to every rank.
    for name in dict.fromkeys([*([THREADS_VAR] if rank_threads(plan) is not None else []),
                               *(setting.split("=", 1)[0] for setting in launch_env(plan))]):
        launch += ["-x", name]
    return launch + _program(plan)


def elastic_min_nodes(hosts: Sequence[Host], min_np: int) -> int:
    """torchrun counts nodes, not ranks: the fewest nodes that hold `min_np` ranks whichever of `hosts` are left."""
    total = 0
    for count, slots in enumerate(sorted(h.slots for h in hosts), 1):
        total += slots
        if total >= min_np:
            return count
    return len(hosts)


# torchrun reads --rdzv-id and --rdzv-endpoint from these variables when the command line has none.
TORCHRUN_RDZV_ID_ENV = "PET_RDZV_ID"
TORCHRUN_RDZV_ENDPOINT_ENV = "PET_RDZV_ENDPOINT"


def torchrun_argv(plan: JobPlan, node_rank: int) -> list[str]:
    host = plan.hosts[node_rank]
    port = plan.rendezvous_port or TORCHRUN_PORT
    argv = [plan.tool("torchrun"), "--nproc-per-node", str(host.slots)]
    if plan.restarts_by_agents:
        # c10d rendezvous on the first node: the agents meet again after a failure, with the
        # nodes that are left, and number the nodes themselves.
        argv += ["--nnodes", f"{elastic_min_nodes(plan.hosts, plan.elastic_min_np or plan.np)}:{len(plan.hosts)}",
                 "--max-restarts", str(plan.elastic_restarts)]
    elif not plan.slurm:
        argv += ["--nnodes", str(len(plan.hosts)), "--node-rank", str(node_rank),
                 "--master-addr", plan.rank0.address, "--master-port", str(port)]
        return [*argv, "--rdzv-id", plan.job_id, str(plan.remote_script), *workload_args(plan)]
    else:
        argv += ["--nnodes", str(len(plan.hosts))]
    argv += ["--rdzv-backend", "c10d", "--local-addr", host.address]
    # Through Slurm the rendezvous is named after the Slurm job and meets on a port of the job's
    # own: the batch script sets TORCHRUN_RDZV_ID_ENV and TORCHRUN_RDZV_ENDPOINT_ENV as it starts
    # (pycli.jobs.slurm.sbatch_script).
    if plan.slurm:
        return [*argv, str(plan.remote_script), *workload_args(plan)]
    argv += ["--rdzv-endpoint", f"{plan.rank0.address}:{port}", "--rdzv-id", plan.job_id]
    return [*argv, str(plan.remote_script), *workload_args(plan)]


def cpu_only(plan: JobPlan) -> bool:
    """The job has no GPU: it asked for none (--gpus-per-node 0), or staging found none on any of its nodes."""
    return plan.request.placement.gpus_per_node == 0 or (bool(plan.node_gpus) and not any(gpus for _, gpus in plan.node_gpus))


def gpus_short(asked: int | None, counts: Sequence[tuple[str, int]], counted_by: str) -> str | None:
    """The line that refuses --gpus-per-node where a node of the job has fewer GPUs; None where each has enough."""
    if asked is None or not (short := [f"{name} has {gpus}" for name, gpus in counts if gpus < asked]):
        return None
    return f"--gpus-per-node {asked}: more GPUs than a node of the job has ({', '.join(short)}, {counted_by})"


def job_gpus_env(plan: JobPlan) -> list[str]:
    """The GPUs a job's ranks see, where pycli gives them out: over SSH with --gpus-per-node N, the
    first N of each node (CUDA_VISIBLE_DEVICES; empty for none). Through Slurm, Slurm sets it to
    the GPUs it allocated the job on each node."""
    asked = plan.request.placement.gpus_per_node
    if asked is None or plan.slurm:
        return []
    return [f"{GPUS_VAR}={','.join(str(index) for index in range(asked))}"]


def launch_env(plan: JobPlan) -> list[str]:
    """NAME=VALUE settings of the job beyond threads: Horovod's run settings where Horovod runs
    the collectives on CPUs, the GPUs the job sees, then the user's --env (the later wins)."""
    own = list(HOROVOD_CPU_ENV) if plan.launcher in ("horovod", "mpirun") and cpu_only(plan) else []
    return [*own, *job_gpus_env(plan), *plan.request.launch.env]


def remote_shell(plan: JobPlan, argv: Sequence[str], hosts: Sequence[Host] | None = None) -> str:
    """The shell line run on a node: the job's folder, the shared venv first on PATH, the
    threads of the ranks it starts on `hosts` (horovodrun and mpirun pass the environment on
    to every rank).

    With --docker, the same command inside the node's job container, on the image's PATH."""
    env = ["PYTHONUNBUFFERED=1"]
    if (threads := rank_threads(plan, hosts)) is not None:
        env.append(f"{THREADS_VAR}={threads}")
    env += launch_env(plan)
    if plan.restarts_by_agents:
        env += TORCHRUN_ELASTIC_ENV
    env += socket_interface_env(plan.network_interface)
    if plan.request.container:
        # The rendezvous id and endpoint the batch script sets go on into the container, as Slurm's own
        # variables do not: the container sees only the job's GPUs, numbered from 0.
        passed = [TORCHRUN_RDZV_ID_ENV, TORCHRUN_RDZV_ENDPOINT_ENV] if plan.slurm and plan.launcher == "torchrun" else []
        return containers.exec_line(plan.request.container, plan.job_id, plan.job_dir, env, argv,
                                    tty=not plan.slurm, passed=passed)
    # Every word quoted, the inventory's and the command line's values with them; only the
    # node's own $PATH is left for its shell to expand.
    path = shlex.quote(f"PATH={plan.layout.venv / 'bin'}") + ':"$PATH"'
    if plan.logins_as_steps:  # horovodrun's ssh is the job's own (slurm_ssh_script)
        path = shlex.quote(f"PATH={plan.slurm_ssh_dir}:{plan.layout.venv / 'bin'}") + ':"$PATH"'
    return f"cd {shlex.quote(str(plan.job_dir))} && exec env {path} {shlex.join([*env, *argv])}"


# How long the job's processes get to exit on SIGTERM before SIGKILL, in half-seconds.
SWEEP_GRACE_TICKS = 10


def job_process_pattern(job_dir: PurePosixPath) -> str:
    """A pkill/pgrep pattern for the job's processes (their command lines name its folder) that
    does not match the shell running it: `[/]srv/...` matches "/srv/..." but not itself."""
    path = str(job_dir)
    if not re.fullmatch(r"(/[A-Za-z0-9_.-]+)+", path):
        raise BadInput(f"job folder {path!r} ({WORK_DIR_VAR}): only letters, digits, '_', '.', '-' and '/' may name it")
    return "[/]" + path[1:].replace(".", "[.]") + "([/ ]|$)"  # job 42's pattern does not match job 421


def stray_sweep_line(job_dir: PurePosixPath) -> str:
    """The shell line that leaves no process of the job on a node: SIGTERM, a grace period,
    SIGKILL, then the survivors listed on stderr and exit 3 (pgrep lists zombies too: wait for them)."""
    pattern = shlex.quote(job_process_pattern(job_dir))
    return (
        f"p={pattern}; pkill -TERM -f \"$p\"; i=0; "
        f"while pgrep -f \"$p\" >/dev/null && [ $i -lt {SWEEP_GRACE_TICKS} ]; do sleep 0.5; i=$((i+1)); done; "
        "pkill -KILL -f \"$p\"; i=0; "
        "while pgrep -f \"$p\" >/dev/null && [ $i -lt 4 ]; do sleep 0.5; i=$((i+1)); done; "
        "if pgrep -af \"$p\" >&2; then exit 3; fi"
    )


def launch_commands(plan: JobPlan) -> list[tuple[Host, str]]:
    """(host, shell line) for every process pycli starts over SSH: one launcher, or one per node."""
    if plan.launcher == "torchrun":
        return [(host, remote_shell(plan, torchrun_argv(plan, i), [host])) for i, host in enumerate(plan.hosts)]
    if plan.launcher == "mpirun":
        user = "root" if plan.request.container else plan.rank0.login_user  # job containers run as root
        return [(plan.rank0, remote_shell(plan, job_mpirun_argv(plan, user)))]
    return [(plan.rank0, remote_shell(plan, horovodrun_argv(plan)))]
