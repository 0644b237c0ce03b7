"""The health gates of `pycli check`, in order; the first failure stops the check.

Each gate is a small function from the check's context to a `GateResult` (pass, fail or
skip, with its figure and a message that says what to change). How a gate gathers what it
needs (pycli.cluster.nodes for commands, pycli.cluster.node_facts for facts, pycli.jobs.train for the allreduce
job) is kept apart from what it concludes: pure `evaluate_*` functions over what the nodes
answered, which is what the unit tests exercise. Running the gates and showing their
results is pycli.health.run.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pycli.cluster.model import INTERFACE_VAR, Cluster, Host
from pycli.cluster.node_facts import NodeFacts, gather_node_facts
from pycli.cluster.nodes import SSH_TIMEOUT_S, NodeOutput, run_on_nodes, ssh_probe
from pycli.core.errors import EXIT_FAILED, EXIT_UNREACHABLE, BadInput
from pycli.core.sizes import human_size, parse_size
from pycli.health.options import CheckOptions
from pycli.jobs.launch import ALLREDUCE_SCRIPT, mpirun_argv
from pycli.jobs.log import run_logged_job
from pycli.jobs.request import JobRequest
from pycli.jobs.train import layout_of

MPIRUN_TIMEOUT_S = 120
DOCKER_TIMEOUT_S = 900


# --- gates ---------------------------------------------------------------------------------

PASS, FAIL, SKIP, NOT_RUN = "pass", "fail", "skip", "not run"


@dataclass(frozen=True)
class GateResult:
    name: str
    status: str
    figure: str = ""
    message: str = ""
    seconds: float = 0.0
    exit_code: int = EXIT_FAILED  # what `pycli check` returns when this gate fails

    @property
    def stops(self) -> bool:
        return self.status == FAIL


def passed(name: str, figure: str) -> GateResult:
    return GateResult(name, PASS, figure)


def failed(name: str, message: str, figure: str = "", exit_code: int = EXIT_FAILED) -> GateResult:
    return GateResult(name, FAIL, figure, message, exit_code=exit_code)


def skipped(name: str, why: str) -> GateResult:
    return GateResult(name, SKIP, why)


@dataclass
class CheckContext:
    cluster: Cluster
    run_dir: Path
    options: CheckOptions
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    deep: dict[str, object] = field(default_factory=dict)  # the deep gates' figures (deep.json)
    suspects: dict[str, str] = field(default_factory=dict)  # node -> why the deep gates name it

    @property
    def names(self) -> list[str]:
        return [host.name for host in self.cluster.hosts]

    def step_dir(self, name: str) -> Path:
        return self.run_dir / name


# Gate 1: every node reachable.


def evaluate_reachable(names: Sequence[str], answers: Mapping[str, NodeOutput]) -> GateResult:
    down = [answers[name] for name in names if not answers[name].ok]
    if down:
        detail = "; ".join(f"{out.host}: {out.why().rstrip('.')}" for out in down)
        return failed("reachable", f"{detail}. Start the node or its sshd, or fix its address in the inventory",
                      f"{len(names) - len(down)}/{len(names)} nodes accept an SSH login", EXIT_UNREACHABLE)
    return passed("reachable", f"{len(names)}/{len(names)} nodes accept a new SSH login (BatchMode, host keys checked)")


def gate_reachable(ctx: CheckContext) -> GateResult:
    return evaluate_reachable(ctx.names, ssh_probe(ctx.cluster.hosts))


# Gate 2: all-to-all SSH in batch mode, host keys checked.

_MESH_LINE = re.compile(r"^PYCLI-SSH (?P<result>OK|FAIL) (?P<target>\S+) ?(?P<detail>.*)$")


def mesh_command(hosts: Sequence[Host]) -> str:
    """From one node, log in to every node's address as the launchers do; one line per target."""
    targets = " ".join(shlex.quote(f"{host.address}:{host.port}") for host in hosts)
    return (
        f"for target in {targets}; do\n"
        '  addr="${target%:*}"; port="${target##*:}"\n'
        f'  if out=$(ssh -n -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout={SSH_TIMEOUT_S} '
        '-p "$port" -- "$addr" hostname 2>&1); then\n'
        '    echo "PYCLI-SSH OK $target $out"\n'
        "  else\n"
        '    echo "PYCLI-SSH FAIL $target $(printf %s "$out" | tail -n 1)"\n'
        "  fi\n"
        "done"
    )


def evaluate_mesh(hosts: Sequence[Host], answers: Mapping[str, NodeOutput]) -> GateResult:
    expected = {f"{host.address}:{host.port}": host.name for host in hosts}
    problems, good = [], 0
    for source in hosts:
        answer = answers[source.name]
        seen = {}
        for line in answer.stdout.splitlines():
            if match := _MESH_LINE.match(line.strip()):
                seen[match["target"]] = (match["result"], match["detail"].strip())
        if answer.rc is None or not seen:
            problems.append(f"{source.name}: could not run ssh there ({answer.why()})")
            continue
        for target, name in expected.items():
            result, detail = seen.get(target, ("FAIL", "no answer"))
            if result == "OK":
                good += 1
            else:
                problems.append(f"{source.name} -> {name} ({target}): {detail.rstrip('.') or 'failed'}")
    pairs = len(hosts) ** 2
    figure = f"{good}/{pairs} node pairs log in (BatchMode, host keys checked)"
    if problems:
        fix = ". Run 'pycli provision' (role ssh_trust) to set up keys and known_hosts"
        return failed("ssh_mesh", "; ".join(problems) + fix, figure)
    return passed("ssh_mesh", figure)


def gate_ssh_mesh(ctx: CheckContext) -> GateResult:
    if len(ctx.cluster.hosts) == 1 and ctx.cluster.hosts[0].local:
        return skipped("ssh_mesh", "one host, this machine (ansible_connection=local): its jobs need no SSH")
    answers = run_on_nodes(ctx.cluster, ctx.names, ctx.step_dir("ssh_mesh"), mesh_command(ctx.cluster.hosts))
    return evaluate_mesh(ctx.cluster.hosts, answers)


# Gate 3: the same software everywhere.

SAME_SOFTWARE = (("python", "Python"), ("torch", "torch"), ("horovod", "Horovod"), ("openmpi", "Open MPI"))


def evaluate_same_software(names: Sequence[str], facts: Mapping[str, NodeFacts]) -> GateResult:
    problems, figures = [], []
    for attribute, label in SAME_SOFTWARE:
        versions = {name: getattr(facts[name], attribute) for name in names}
        distinct = set(versions.values())
        if distinct == {""}:
            problems.append(f"{label} is not installed on any node")
        elif len(distinct) > 1:
            listed = ", ".join(f"{name} {version or 'not installed'}" for name, version in versions.items())
            problems.append(f"{label} differs: {listed}")
        else:
            figures.append(f"{label} {distinct.pop()}")
    figure = ", ".join(figures) + f" on {len(names)} nodes" if figures else ""
    if problems:
        return failed("same_software", "; ".join(problems) + ". Run 'pycli provision' on the inventory", figure)
    return passed("same_software", figure)


def gate_same_software(ctx: CheckContext) -> GateResult:
    ctx.facts = gather_node_facts(ctx.cluster, ctx.names, ctx.step_dir("same_software"), layout_of(ctx.cluster).venv)
    return evaluate_same_software(ctx.names, ctx.facts)


# Gate 4: Horovod built with what the cluster needs.


def required_horovod_build(facts: Mapping[str, NodeFacts], controllers: Sequence[str]) -> tuple[set[str], set[str]]:
    """(controllers, tensor operations) the profile needs: NCCL ops as soon as any node has a GPU."""
    operations = set(controllers)
    if any(node.has_gpu_hardware for node in facts.values()):
        operations.add("nccl")
    return set(controllers), operations


def evaluate_horovod_build(names: Sequence[str], facts: Mapping[str, NodeFacts], controllers: Sequence[str]) -> GateResult:
    need_controllers, need_operations = required_horovod_build(facts, controllers)
    problems = []
    for name in names:
        build = facts[name].horovod_build
        if build is None:
            problems.append(f"{name}: horovodrun --check-build did not run")
            continue
        missing = []
        if "pytorch" not in build.frameworks:
            missing.append("the PyTorch framework")
        missing += [f"the {c.upper() if c == 'mpi' else c.capitalize()} controller"
                    for c in sorted(need_controllers - build.controllers)]
        missing += [f"{op.upper()} tensor operations" for op in sorted(need_operations - build.operations)]
        if missing:
            problems.append(f"{name}: built without {', '.join(missing)}")
    figure = (f"PyTorch; controllers {'/'.join(sorted(need_controllers))}; "
              f"ops {'/'.join(sorted(need_operations))} on {len(names)} nodes")
    if problems:
        return failed("horovod_build", "; ".join(problems) + ". Rebuild Horovod with 'pycli provision --tags horovod'")
    return passed("horovod_build", figure)


def gate_horovod_build(ctx: CheckContext) -> GateResult:
    return evaluate_horovod_build(ctx.names, ctx.facts, ctx.options.controllers)


# Gate 5: mpirun across every node.


def mpirun_command(mpirun: str, hosts: Sequence[Host], user: str, network_interface: str | None) -> str:
    """mpirun from the launcher running `hostname` once on every node, with the flags of `pycli train`'s jobs.

    Untagged output: the gate compares the host names themselves."""
    one_each = [replace(host, slots=1) for host in hosts]
    argv = mpirun_argv(mpirun, one_each, np=len(hosts), user=user, ssh_ports={host.port for host in hosts},
                       network_interface=network_interface, tag_output=False)
    return shlex.join(["timeout", str(MPIRUN_TIMEOUT_S), *argv, "hostname"])


def evaluate_mpirun(names: Sequence[str], facts: Mapping[str, NodeFacts], answer: NodeOutput, seconds: float) -> GateResult:
    expected = sorted(facts[name].hostname for name in names)
    seen = sorted(line.strip() for line in answer.stdout.splitlines() if line.strip())
    if answer.rc != 0:
        return failed("mpirun", f"mpirun exited {answer.rc}: {answer.why()}")
    if seen != expected:
        return failed("mpirun", f"mpirun ran on {', '.join(seen) or 'nothing'}; expected each of {', '.join(expected)} once")
    return passed("mpirun", f"{len(seen)} nodes ran hostname ({', '.join(seen)}) in {seconds:.1f} s")


def gate_mpirun(ctx: CheckContext) -> GateResult:
    launcher = ctx.cluster.launcher_host
    mpirun = ctx.facts[launcher.name].mpirun
    if not mpirun:
        return failed("mpirun", f"no mpirun on the launcher {launcher.name}. Run 'pycli provision --tags openmpi'")
    try:
        command = mpirun_command(mpirun, ctx.cluster.hosts, launcher.login_user,
                                 ctx.cluster.settings.get(INTERFACE_VAR))
    except BadInput as exc:  # host addresses mpirun -H cannot tell apart
        return failed("mpirun", str(exc))
    began = time.monotonic()
    answer = run_on_nodes(ctx.cluster, [launcher.name], ctx.step_dir("mpirun"), command)[launcher.name]
    return evaluate_mpirun(ctx.names, ctx.facts, answer, time.monotonic() - began)


# Gate 6: a Horovod allreduce across every node: correct, and fast enough.


def evaluate_allreduce(records: Sequence[Mapping[str, Any]], *, ranks: int, nodes: int, size: int,
                       floor_gbps: float) -> GateResult:
    record = next((r for r in records if r.get("workload") == "allreduce" and r.get("bytes") == size), None)
    if record is None:
        return failed("allreduce", f"the allreduce job wrote no result for {human_size(size)}")
    figure = (f"busbw {record['busbw_gbps']:.3g} ± {record['busbw_gbps_ci95']:.2g} GB/s at {human_size(size)}, "
              f"{record['ranks']} ranks on {record['hosts']} nodes via {record['backend']}")
    if not record.get("correct") or record["ranks"] != ranks or record["hosts"] != nodes:
        return failed("allreduce", f"expected a correct sum over {ranks} ranks on {nodes} nodes; got {figure}", figure)
    if record["busbw_gbps"] < floor_gbps:
        return failed("allreduce", f"busbw {record['busbw_gbps']:.3g} GB/s is below the floor of {floor_gbps:g} GB/s "
                      f"(--busbw-floor); look at the NIC ({INTERFACE_VAR}) and `pycli bench`", figure)
    floor = f"floor {floor_gbps:g} GB/s" if floor_gbps else "no floor"
    return passed("allreduce", f"{figure}; {floor}")


def allreduce_request(cluster: Cluster, controller: str, size: int) -> JobRequest:
    """The allreduce gate's job: workloads/allreduce.py on every slot, under horovodrun."""
    return JobRequest.of(
        np=cluster.total_slots, workload=str(ALLREDUCE_SCRIPT), launcher="horovod", controller=controller,
        script_args=("--sizes", str(size), "--iters", "5", "--metrics", "metrics.jsonl"),
    )


def gate_allreduce(ctx: CheckContext) -> GateResult:
    size = parse_size(ctx.options.allreduce_size, "--allreduce-size")
    request = allreduce_request(ctx.cluster, ctx.options.controller, size)
    job = run_logged_job(ctx.cluster, request, ctx.step_dir("allreduce"))
    if job.refused:
        return failed("allreduce", job.refused)
    if job.code != 0:
        return failed("allreduce", f"the horovodrun --{ctx.options.controller} job failed (exit {job.code}): "
                      f"{job.failure()}; full output in {job.log}")
    return evaluate_allreduce(job.records, ranks=ctx.cluster.total_slots, nodes=len(ctx.cluster.hosts), size=size,
                              floor_gbps=ctx.options.busbw_floor_gbps)


# Gates 7-9: GPU nodes (only where NVIDIA hardware is on the PCI bus).


def gpu_nodes(names: Sequence[str], facts: Mapping[str, NodeFacts]) -> list[str]:
    return [name for name in names if facts[name].has_gpu_hardware]


NO_GPU = "no NVIDIA GPU on any node"


def evaluate_nvidia_smi(names: Sequence[str], facts: Mapping[str, NodeFacts]) -> GateResult:
    nodes = gpu_nodes(names, facts)
    if not nodes:
        return skipped("nvidia_smi", NO_GPU)
    problems, figures = [], []
    for name in nodes:
        node = facts[name]
        if node.nvidia_smi_rc is None:
            problems.append(f"{name}: {len(node.gpu_pci)} NVIDIA GPU(s) on the PCI bus but no nvidia-smi (no driver)")
        elif node.nvidia_smi_rc != 0:
            problems.append(f"{name}: nvidia-smi failed: {node.nvidia_smi_error}")
        elif len(node.gpus) != len(node.gpu_pci):
            problems.append(f"{name}: nvidia-smi shows {len(node.gpus)} of the {len(node.gpu_pci)} GPUs on the PCI bus")
        else:
            figures.append(f"{name} {len(node.gpus)}x {node.gpus[0]}")
    if problems:
        return failed("nvidia_smi", "; ".join(problems) + ". Run 'pycli provision --tags nvidia_driver' and reboot if it asks")
    return passed("nvidia_smi", ", ".join(figures))


def evaluate_driver_library(names: Sequence[str], facts: Mapping[str, NodeFacts]) -> GateResult:
    nodes = gpu_nodes(names, facts)
    if not nodes:
        return skipped("driver_library", NO_GPU)
    problems, versions = [], set()
    for name in nodes:
        node = facts[name]
        if node.kernel_module and node.nvml_library and node.kernel_module in node.nvml_library.split(", ") \
                and len(node.nvml_library.split(", ")) == 1:
            versions.add(node.kernel_module)
        else:
            problems.append(f"{name}: kernel module {node.kernel_module or 'not loaded'}, "
                            f"user-space library (NVML) {node.nvml_library or 'missing'}")
    if problems:
        return failed("driver_library", "; ".join(problems) + ". The driver was upgraded without a reboot, or two "
                      "driver versions are installed: reboot, or reinstall one driver branch")
    return passed("driver_library", f"kernel module = library {', '.join(sorted(versions))} on {len(nodes)} GPU nodes")


def docker_gpu_command(image: str) -> str:
    return shlex.join(["timeout", str(DOCKER_TIMEOUT_S), "docker", "run", "--rm", "--gpus", "all", image, "nvidia-smi", "-L"])


def evaluate_docker_gpu(
    nodes: Sequence[str], facts: Mapping[str, NodeFacts], answers: Mapping[str, NodeOutput], image: str
) -> GateResult:
    problems, figures = [], []
    for name in nodes:
        answer = answers[name]
        listed = sum(line.startswith("GPU ") for line in answer.stdout.splitlines())
        if answer.rc != 0:
            problems.append(f"{name}: docker run --gpus all failed: {answer.why()}")
        elif listed != facts[name].gpu_count:
            problems.append(f"{name}: the container sees {listed} of {facts[name].gpu_count} GPUs")
        else:
            figures.append(f"{name} {listed} GPUs")
    if problems:
        return failed("docker_gpu", "; ".join(problems) + ". Run 'pycli provision --tags nvidia_container_toolkit'")
    return passed("docker_gpu", f"{image}: " + ", ".join(figures))


def gate_nvidia_smi(ctx: CheckContext) -> GateResult:
    return evaluate_nvidia_smi(ctx.names, ctx.facts)


def gate_driver_library(ctx: CheckContext) -> GateResult:
    return evaluate_driver_library(ctx.names, ctx.facts)


def gate_docker_gpu(ctx: CheckContext) -> GateResult:
    nodes = gpu_nodes(ctx.names, ctx.facts)
    if not nodes:
        return skipped("docker_gpu", NO_GPU)
    answers = run_on_nodes(ctx.cluster, nodes, ctx.step_dir("docker_gpu"), docker_gpu_command(ctx.options.cuda_image))
    return evaluate_docker_gpu(nodes, ctx.facts, answers, ctx.options.cuda_image)


@dataclass(frozen=True)
class Gate:
    name: str
    what: str
    run: Callable[[CheckContext], GateResult]
    # A failure stops the check (later gates need what this one proved); the deep gates
    # measure independent things, so a slow node does not keep the links from being measured.
    stops_the_check: bool = True
    # Runs after an earlier gate failed (only `reachable`'s failure stops it): the deep gates,
    # per node and per pair, are how a person finds why a whole-cluster gate failed.
    after_failure: bool = False


# The first gate: where it fails, no later gate can run on every node.
REACHABLE = "reachable"

GATES = (
    Gate(REACHABLE, "every node accepts a new SSH login", gate_reachable),
    Gate("ssh_mesh", "every node logs in to every node (BatchMode, host keys checked)", gate_ssh_mesh),
    Gate("same_software", "the same Python, torch, Horovod and Open MPI on every node", gate_same_software),
    Gate("horovod_build", "horovodrun --check-build has what the cluster needs", gate_horovod_build),
    Gate("mpirun", "mpirun starts a process on every node", gate_mpirun),
    Gate("allreduce", "a Horovod allreduce across every node is correct and above the busbw floor", gate_allreduce),
    Gate("nvidia_smi", "nvidia-smi sees every GPU on GPU nodes", gate_nvidia_smi),
    Gate("driver_library", "the NVIDIA kernel module matches the user-space library", gate_driver_library),
    Gate("docker_gpu", "docker run --gpus all sees the GPUs", gate_docker_gpu),
)
