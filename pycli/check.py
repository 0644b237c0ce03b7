"""`pycli check INVENTORY`: health gates in order, stopping at the first failure.

Each gate is a small function from the check's context to a `GateResult` (pass, fail or
skip, with its figure and a message that says what to change). Gates do their work on the
nodes through the one runner adapter (ad-hoc commands, playbooks/facts.yml) or through
`pycli.train` for the allreduce job; what they conclude comes from pure `evaluate_*`
functions over what the nodes answered, which is what the unit tests exercise.

This module also owns what pycli knows about a node's software and hardware (`NodeFacts`,
gathered by playbooks/facts.yml): `pycli bench` reads the same facts for its environment
table and to decide which combinations a cluster can run.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pycli import runner
from pycli.cluster_model import Cluster, Host
from pycli.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, BadInput, PycliError, Unreachable
from pycli.launch_lines import HOROVOD_CONTROLLERS
from pycli.job_log import job_failure, run_logged_job
from pycli.paths import PROJECT_ROOT, new_run_dir
from pycli.train import JobRequest

FACTS_PLAYBOOK = PROJECT_ROOT / "playbooks" / "facts.yml"
ALLREDUCE_SCRIPT = PROJECT_ROOT / "workloads" / "allreduce.py"
DEFAULT_CUDA_IMAGE = "nvidia/cuda:12.8.1-base-ubuntu22.04"
SSH_TIMEOUT_S = 10
MPIRUN_TIMEOUT_S = 120
DOCKER_TIMEOUT_S = 900

# --- sizes (shared with `pycli bench`) -----------------------------------------------------

_SIZE = re.compile(r"^(?P<number>[0-9]+)(?P<unit>[KMG]?)B?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str, what: str) -> int:
    """'4K', '256M', '1G' or a byte count, binary units as nccl-tests reads them; BadInput else."""
    match = _SIZE.match(text.strip())
    size = int(match["number"]) * _UNITS[match["unit"].upper()] if match else 0
    if size < 4 or size % 4:
        raise BadInput(f"{what} {text!r}: give a size such as 4K, 64M or 1G (a positive multiple of 4 bytes)")
    return size


def human_size(size: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


# --- commands on nodes (the thin adapter over runner.run) ----------------------------------


@dataclass(frozen=True)
class NodeOutput:
    """What one node answered to one command; rc None when Ansible could not reach it."""

    host: str
    rc: int | None
    stdout: str = ""
    stderr: str = ""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def why(self) -> str:
        """The most telling line of a failure."""
        for text in (self.stderr, self.message, self.stdout):
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if lines:
                return lines[-1]
        return f"exit {self.rc}" if self.rc is not None else "no answer"


_EVENT_OUTCOMES = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")


def node_output_from_event(event: Mapping[str, object]) -> NodeOutput | None:
    """One ansible-runner host event as a NodeOutput (None for every other event)."""
    if event.get("event") not in _EVENT_OUTCOMES:
        return None
    data = event.get("event_data") or {}
    res = data.get("res") or {}
    host = str(data.get("host"))
    if event["event"] == "runner_on_unreachable":
        return NodeOutput(host, None, message=str(res.get("msg", "unreachable")))
    rc = res.get("rc")
    if rc is None:
        rc = 1 if event["event"] == "runner_on_failed" else 0
    return NodeOutput(host, int(rc), str(res.get("stdout", "")), str(res.get("stderr", "")), str(res.get("msg", "")))


def run_on_nodes(
    cluster: Cluster, hosts: Sequence[str], run_dir: Path, command: str | None = None, *, module: str = "ansible.builtin.shell"
) -> dict[str, NodeOutput]:
    """Run a bash `command` (or a module without arguments, e.g. ping) on `hosts`; every host answers."""
    args = ""
    if command is not None:
        if any(marker in command for marker in ("{{", "{%", "{#")):
            raise ValueError("Ansible would template this command; it must not hold Jinja markers")
        args = json.dumps({"cmd": command, "executable": "/bin/bash"})
    request = runner.RunRequest(inventory=cluster.inventory_path, pattern=",".join(hosts), module=module, module_args=args)
    answers: dict[str, NodeOutput] = {}

    def on_event(event: Mapping[str, object]) -> None:
        if (output := node_output_from_event(event)) is not None:
            answers[output.host] = output

    runner.run(request, run_dir, on_event=on_event)
    return {host: answers.get(host, NodeOutput(host, None, message="Ansible reported nothing for it")) for host in hosts}


# --- node facts (playbooks/facts.yml) ------------------------------------------------------


@dataclass(frozen=True)
class HorovodBuild:
    """`horovodrun --check-build`: what this Horovod was built with (lower-case names)."""

    frameworks: frozenset[str]
    controllers: frozenset[str]
    operations: frozenset[str]

    def describe(self) -> str:
        def names(items: Iterable[str]) -> str:
            return "/".join(sorted(items)) or "none"

        return f"frameworks {names(self.frameworks)}; controllers {names(self.controllers)}; ops {names(self.operations)}"


@dataclass(frozen=True)
class NodeFacts:
    """One node's environment; empty strings where a tool is not installed."""

    host: str
    hostname: str = ""
    os: str = ""
    kernel: str = ""
    cpu_model: str = ""
    cpus: int = 0
    memory_mb: int = 0
    nic_interface: str = ""
    nic_driver: str = ""
    nic_speed_mbps: int | None = None
    nic_mtu: int | None = None
    nic_address: str = ""
    python: str = ""
    torch: str = ""
    torch_cuda: str = ""
    torch_nccl: str = ""
    horovod: str = ""
    horovod_build: HorovodBuild | None = None
    mpirun: str = ""
    openmpi: str = ""
    iperf3: str = ""
    gpu_pci: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()  # as nvidia-smi names them
    nvidia_smi_rc: int | None = None  # None: no nvidia-smi
    nvidia_smi_error: str = ""
    driver: str = ""  # nvidia-smi's driver_version (the user-space library)
    kernel_module: str = ""  # /proc/driver/nvidia/version
    nvml_library: str = ""  # libnvidia-ml.so.<version>
    nvlink_links: int = 0
    cuda: str = ""
    nccl: str = ""
    docker: str = ""

    @property
    def gpu_count(self) -> int:
        """GPUs a process can use: those the driver shows."""
        return len(self.gpus) if self.nvidia_smi_rc == 0 else 0

    @property
    def has_gpu_hardware(self) -> bool:
        return bool(self.gpu_pci)


def parse_probe(text: str) -> dict[str, str]:
    """facts.yml's probe output: `### name` lines, each followed by that tool's output."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("### "):
            current = sections.setdefault(line[4:].strip(), [])
        elif current is not None:
            current.append(line.rstrip())
    return {name: "\n".join(lines).strip() for name, lines in sections.items()}


def parse_check_build(text: str) -> HorovodBuild | None:
    """The [X] entries of `horovodrun --check-build`, per heading; None when it did not run."""
    found: dict[str, set[str]] = {"frameworks": set(), "controllers": set(), "operations": set()}
    heading = None
    for line in text.splitlines():
        stripped = line.strip()
        lowered = stripped.lower()
        if lowered.startswith("available frameworks"):
            heading = "frameworks"
        elif lowered.startswith("available controllers"):
            heading = "controllers"
        elif lowered.startswith("available tensor operations"):
            heading = "operations"
        elif heading and stripped.startswith("[X]"):
            found[heading].add(stripped[3:].strip().lower())
    if not any(found.values()) and "Horovod" not in text:
        return None
    return HorovodBuild(*(frozenset(found[key]) for key in ("frameworks", "controllers", "operations")))


_VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)*)\b")


def first_version(text: str) -> str:
    match = _VERSION.search(text)
    return match.group(1) if match else ""


def _first_line(text: str) -> str:
    return text.splitlines()[0].strip() if text.strip() else ""


def _looks_like_error(text: str) -> bool:
    return any(marker in text for marker in ("Traceback", "Error", "error:", "not found", "No such file"))


def _clean(text: str) -> str:
    """A probe section's value, or '' when the tool was missing or failed."""
    return "" if not text or _looks_like_error(text) else _first_line(text)


def parse_nvidia_smi(section: str) -> tuple[int | None, tuple[str, ...], str, str]:
    """(rc, GPU names, driver version, error) from `nvidia-smi --query-gpu=...; echo rc=$?`."""
    lines = [line.strip() for line in section.splitlines() if line.strip()]
    rc_line = next((line for line in reversed(lines) if line.startswith("rc=")), None)
    rc = int(rc_line[3:]) if rc_line and rc_line[3:].isdigit() else None
    body = [line for line in lines if not line.startswith("rc=")]
    if rc == 127 or rc is None:  # command not found: no driver installed
        return None, (), "", ""
    if rc != 0:
        return rc, (), "", "; ".join(body) if body else f"nvidia-smi exited {rc}"
    names, drivers = [], set()
    for line in body:
        parts = [part.strip() for part in line.split(",")]
        if len(parts) >= 2:
            names.append(parts[0])
            drivers.add(parts[1])
    return rc, tuple(names), ", ".join(sorted(drivers)), ""


def parse_nvml_library(section: str) -> str:
    """The driver version in libnvidia-ml.so.<version> (not the .so.1 link)."""
    versions = sorted({m.group(1) for m in re.finditer(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)", section)})
    return ", ".join(versions)


def parse_cuda(section: str) -> str:
    match = re.search(r"release (\d+\.\d+)(?:, V(\d+\.\d+\.\d+))?", section)
    if not match:
        return ""
    return match.group(2) or match.group(1)


def node_facts_from_json(data: Mapping[str, object]) -> NodeFacts:
    """NodeFacts from one file facts.yml wrote."""
    probe = parse_probe(str(data.get("probe", "")))
    nic = data.get("nic") or {}
    smi_rc, gpus, driver, smi_error = parse_nvidia_smi(probe.get("nvidia_smi", ""))

    def number(value: object) -> int | None:
        try:
            return int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None

    openmpi_line = probe.get("openmpi", "")
    return NodeFacts(
        host=str(data["host"]),
        hostname=str(data.get("hostname", "")),
        os=str(data.get("os", "")),
        kernel=str(data.get("kernel", "")),
        cpu_model=str(data.get("cpu_model", "")),
        cpus=number(data.get("cpus")) or 0,
        memory_mb=number(data.get("memory_mb")) or 0,
        nic_interface=str(nic.get("interface", "")),
        nic_driver=str(nic.get("driver", "")),
        nic_speed_mbps=number(nic.get("speed_mbps")),
        nic_mtu=number(nic.get("mtu")),
        nic_address=str(nic.get("address", "")),
        python=_clean(probe.get("python", "")),
        torch=_clean(probe.get("torch", "")),
        torch_cuda=_clean(probe.get("torch_cuda", "")),
        torch_nccl=_clean(probe.get("torch_nccl", "")),
        horovod=_clean(probe.get("horovod", "")),
        horovod_build=parse_check_build(probe.get("horovod_check_build", "")),
        mpirun=_clean(probe.get("mpirun", "")),
        openmpi=first_version(openmpi_line) if "Open MPI" in openmpi_line else "",
        iperf3=_clean(probe.get("iperf3", "")),
        gpu_pci=tuple(line.strip() for line in probe.get("gpu_pci", "").splitlines() if line.strip()),
        gpus=gpus,
        nvidia_smi_rc=smi_rc,
        nvidia_smi_error=smi_error,
        driver=driver,
        kernel_module=first_version(probe.get("nvidia_module", "")) if "Kernel Module" in probe.get("nvidia_module", "") else "",
        nvml_library=parse_nvml_library(probe.get("nvml_library", "")),
        nvlink_links=sum("GB/s" in line for line in probe.get("nvlink", "").splitlines()),
        cuda=parse_cuda(probe.get("cuda", "")),
        nccl=_clean(probe.get("nccl", "")),
        docker=first_version(probe.get("docker", "")) if "Docker" in probe.get("docker", "") else "",
    )


def gather_node_facts(cluster: Cluster, hosts: Sequence[str], run_dir: Path) -> dict[str, NodeFacts]:
    """Run playbooks/facts.yml on `hosts` and read back one NodeFacts each."""
    facts_dir = run_dir / "facts"
    facts_dir.mkdir(parents=True, exist_ok=True)
    request = runner.RunRequest(
        inventory=cluster.inventory_path, playbook=FACTS_PLAYBOOK, limit=",".join(hosts),
        extravars={"pycli_facts_dir": str(facts_dir.resolve())},
    )
    result = runner.run(request, run_dir / "facts-run")
    if result.unreachable:
        raise Unreachable(f"gathering facts: cannot reach {', '.join(result.unreachable)}; see {result.run_dir}")
    if result.status != "successful":
        detail = "; ".join(f"{h}: {' '.join(r.messages)}" for h, r in result.hosts.items() if r.failed)
        raise PycliError(f"gathering facts failed: {detail or result.status}; see {result.run_dir}")
    return {host: node_facts_from_json(json.loads((facts_dir / f"{host}.json").read_text())) for host in hosts}


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


@dataclass(frozen=True)
class CheckOptions:
    busbw_floor_gbps: float = 0.0  # 0: no floor
    controller: str = "gloo"  # horovodrun's controller for the allreduce gate
    allreduce_size: str = "64M"
    controllers: tuple[str, ...] = HOROVOD_CONTROLLERS
    cuda_image: str = DEFAULT_CUDA_IMAGE


@dataclass
class CheckContext:
    cluster: Cluster
    run_dir: Path
    options: CheckOptions
    facts: dict[str, NodeFacts] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [host.name for host in self.cluster.hosts]

    def step_dir(self, name: str) -> Path:
        return self.run_dir / name


def check_options(
    *, busbw_floor_gbps: float, controller: str, allreduce_size: str, controllers: str, cuda_image: str
) -> CheckOptions:
    """The options, checked before any node is touched (BadInput, exit 2)."""
    if busbw_floor_gbps < 0:
        raise BadInput(f"--busbw-floor {busbw_floor_gbps}: a bandwidth floor is 0 (off) or more, in GB/s")
    if controller not in HOROVOD_CONTROLLERS:
        raise BadInput(f"unknown --controller {controller!r}; use one of {', '.join(HOROVOD_CONTROLLERS)}")
    parse_size(allreduce_size, "--allreduce-size")
    wanted = tuple(dict.fromkeys(part.strip().lower() for part in controllers.split(",") if part.strip()))
    unknown = [name for name in wanted if name not in HOROVOD_CONTROLLERS]
    if unknown or not wanted:
        raise BadInput(f"--controllers {controllers!r}: name one or more of {', '.join(HOROVOD_CONTROLLERS)}")
    if not cuda_image.strip() or any(ch.isspace() for ch in cuda_image.strip()):
        raise BadInput(f"--cuda-image {cuda_image!r} is not an image name")
    return CheckOptions(busbw_floor_gbps, controller, allreduce_size, wanted, cuda_image.strip())


# Gate 1: every node reachable.


def ssh_probe(hosts: Sequence[Host], command: str = "true") -> dict[str, NodeOutput]:
    """A new SSH login to every host at once, with the inventory's settings and host keys checked.

    OpenSSH directly rather than Ansible: Ansible keeps connections open (ControlPersist),
    and a kept connection outlives a stopped sshd, which is exactly what this must see.
    """
    from pycli.train import ssh_argv

    started = {}
    for host in hosts:
        argv = ssh_argv(host, command)
        argv[1:1] = ["-o", f"ConnectTimeout={SSH_TIMEOUT_S}"]
        started[host.name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True)
    answers = {}
    for name, proc in started.items():
        try:
            out, err = proc.communicate(timeout=3 * SSH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\nno answer within {3 * SSH_TIMEOUT_S} s"
        answers[name] = NodeOutput(name, proc.returncode, out.replace("\r", ""), err.replace("\r", ""))
    return answers


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
        '-p "$port" "$addr" hostname 2>&1); then\n'
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
        return failed("ssh_mesh", "; ".join(problems) + ". Run 'pycli provision' (role ssh_trust) to set up keys and known_hosts", figure)
    return passed("ssh_mesh", figure)


def gate_ssh_mesh(ctx: CheckContext) -> GateResult:
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
    ctx.facts = gather_node_facts(ctx.cluster, ctx.names, ctx.step_dir("same_software"))
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
        missing += [f"the {c.upper() if c == 'mpi' else c.capitalize()} controller" for c in sorted(need_controllers - build.controllers)]
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
    """mpirun from the launcher running `hostname` once on every node, the flags `pycli train` uses."""
    argv = ["timeout", str(MPIRUN_TIMEOUT_S), mpirun, "-np", str(len(hosts)),
            "-H", ",".join(f"{host.address}:1" for host in hosts),
            "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    if user == "root":
        argv.append("--allow-run-as-root")
    ports = {host.port for host in hosts}
    if ports != {22}:
        argv += ["-mca", "plm_rsh_args", f"-p {ports.pop()}"]
    if network_interface:
        argv += ["-mca", "btl_tcp_if_include", network_interface, "-mca", "oob_tcp_if_include", network_interface]
    return shlex.join([*argv, "hostname"])


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
    command = mpirun_command(mpirun, ctx.cluster.hosts, launcher.login_user, ctx.cluster.settings.get("pycli_network_interface"))
    began = time.monotonic()
    answer = run_on_nodes(ctx.cluster, [launcher.name], ctx.step_dir("mpirun"), command)[launcher.name]
    return evaluate_mpirun(ctx.names, ctx.facts, answer, time.monotonic() - began)


# Gate 6: a Horovod allreduce across every node: correct, and fast enough.


def evaluate_allreduce(records: Sequence[dict], *, ranks: int, nodes: int, size: int, floor_gbps: float) -> GateResult:
    record = next((r for r in records if r.get("workload") == "allreduce" and r.get("bytes") == size), None)
    if record is None:
        return failed("allreduce", f"the allreduce job wrote no result for {human_size(size)}")
    figure = (f"busbw {record['busbw_gbps']:.3g} ± {record['busbw_gbps_ci95']:.2g} GB/s at {human_size(size)}, "
              f"{record['ranks']} ranks on {record['hosts']} nodes via {record['backend']}")
    if not record.get("correct") or record["ranks"] != ranks or record["hosts"] != nodes:
        return failed("allreduce", f"expected a correct sum over {ranks} ranks on {nodes} nodes; got {figure}", figure)
    if record["busbw_gbps"] < floor_gbps:
        return failed("allreduce", f"busbw {record['busbw_gbps']:.3g} GB/s is below the floor of {floor_gbps:g} GB/s "
                      "(--busbw-floor); look at the NIC (pycli_network_interface) and `pycli bench`", figure)
    floor = f"floor {floor_gbps:g} GB/s" if floor_gbps else "no floor"
    return passed("allreduce", f"{figure}; {floor}")


def allreduce_request(cluster: Cluster, controller: str, size: int) -> JobRequest:
    """The allreduce gate's job: workloads/allreduce.py on every slot, under horovodrun."""
    return JobRequest(
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


def evaluate_docker_gpu(nodes: Sequence[str], facts: Mapping[str, NodeFacts], answers: Mapping[str, NodeOutput], image: str) -> GateResult:
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


GATES = (
    Gate("reachable", "every node accepts a new SSH login", gate_reachable),
    Gate("ssh_mesh", "every node logs in to every node (BatchMode, host keys checked)", gate_ssh_mesh),
    Gate("same_software", "the same Python, torch, Horovod and Open MPI on every node", gate_same_software),
    Gate("horovod_build", "horovodrun --check-build has what the cluster needs", gate_horovod_build),
    Gate("mpirun", "mpirun starts a process on every node", gate_mpirun),
    Gate("allreduce", "a Horovod allreduce across every node is correct and above the busbw floor", gate_allreduce),
    Gate("nvidia_smi", "nvidia-smi sees every GPU on GPU nodes", gate_nvidia_smi),
    Gate("driver_library", "the NVIDIA kernel module matches the user-space library", gate_driver_library),
    Gate("docker_gpu", "docker run --gpus all sees the GPUs", gate_docker_gpu),
)


def run_gates(
    gates: Sequence[Gate], ctx: CheckContext, on_result: Callable[[GateResult], None] = lambda result: None
) -> list[GateResult]:
    """Each gate in order, timed; after the first failure the rest are `not run`."""
    results: list[GateResult] = []
    stopped = False
    for gate in gates:
        if stopped:
            result = GateResult(gate.name, NOT_RUN)
        else:
            began = time.monotonic()
            result = replace(gate.run(ctx), name=gate.name, seconds=time.monotonic() - began)
            stopped = result.stops
        results.append(result)
        on_result(result)
    return results


def exit_code(results: Sequence[GateResult]) -> int:
    failure = next((result for result in results if result.status == FAIL), None)
    return EXIT_OK if failure is None else failure.exit_code


def result_line(index: int, result: GateResult) -> str:
    """One gate as the user reads it; a failure's message on the next line."""
    label = {PASS: "PASS", FAIL: "FAIL", SKIP: "SKIP", NOT_RUN: "----"}[result.status]
    timing = f" ({result.seconds:.1f} s)" if result.status in (PASS, FAIL) else ""
    line = f"{label} {index:>2} {result.name:<15} {result.figure or ('not run' if result.status == NOT_RUN else '')}{timing}"
    if result.status == FAIL:
        line += f"\n        {result.message}"
    return line.rstrip()


def report_json(inventory: Path, run_dir: Path, results: Sequence[GateResult]) -> dict:
    failure = next((result.name for result in results if result.status == FAIL), None)
    return {
        "inventory": str(inventory),
        "run_dir": str(run_dir),
        "passed": failure is None,
        "failed_gate": failure,
        "exit_code": exit_code(results),
        "gates": [{**{key: value for key, value in asdict(result).items() if key != "exit_code"}, "seconds": round(result.seconds, 2)}
                  for result in results],
    }


def check(cluster: Cluster, options: CheckOptions, *, as_json: bool = False, write: Callable[[str], None] = print) -> int:
    """Run every gate against the cluster's nodes; the exit code is 0 only when all pass."""
    inventory = cluster.inventory_path
    run_dir = new_run_dir("check")
    ctx = CheckContext(cluster=cluster, run_dir=run_dir, options=options)
    if not as_json:
        write(f"pycli: checking {len(cluster.hosts)} nodes of {inventory}; run folder {run_dir}")
    counter = iter(range(1, len(GATES) + 1))

    def show(result: GateResult) -> None:
        index = next(counter)
        if not as_json:
            write(result_line(index, result))

    results = run_gates(GATES, ctx, on_result=show)
    summary = report_json(inventory, run_dir, results)
    (run_dir / "check.json").write_text(json.dumps(summary, indent=2) + "\n")
    if as_json:
        write(json.dumps(summary, indent=2))
    elif summary["passed"]:
        write(f"pycli: all {sum(r.status == PASS for r in results)} gates passed"
              f"{'' if all(r.status == PASS for r in results) else ' (the others do not apply here)'}")
    else:
        write(f"pycli: check failed at gate '{summary['failed_gate']}'; details in {run_dir}")
    return summary["exit_code"]
