"""What pycli knows about a node's software and hardware: `NodeFacts`, from playbooks/facts.yml.

The parsers are pure and tested on recorded output; `gather_node_facts` is the one call
that runs the playbook. `pycli check` gates on these facts; `pycli bench` prints them in its
environment table and reads them to decide which combinations a cluster can run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pycli.cluster import runner
from pycli.cluster.model import Cluster
from pycli.core.errors import PycliError, Unreachable
from pycli.core.tree import PROJECT_ROOT

FACTS_PLAYBOOK = PROJECT_ROOT / "playbooks" / "facts.yml"


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
    nic = data.get("nic")
    nic = nic if isinstance(nic, Mapping) else {}
    smi_rc, gpus, driver, smi_error = parse_nvidia_smi(probe.get("nvidia_smi", ""))

    def number(value: object) -> int | None:
        if not isinstance(value, str | int | float):  # what JSON holds besides text and numbers is no number
            return None
        try:
            return int(value)
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


def gather_node_facts(cluster: Cluster, hosts: Sequence[str], run_dir: Path, venv: PurePosixPath) -> dict[str, NodeFacts]:
    """Run playbooks/facts.yml on `hosts` and read back one NodeFacts each; `venv` is the nodes'
    shared environment, where the probe asks Python, torch and Horovod."""
    facts_dir = run_dir / "facts"
    facts_dir.mkdir(parents=True, exist_ok=True)
    request = runner.RunRequest(
        inventory=cluster.inventory_path, playbook=FACTS_PLAYBOOK, limit=",".join(hosts),
        extravars={"pycli_facts_dir": str(facts_dir.resolve()), "facts_venv": str(venv)},
    )
    result = runner.run(request, run_dir / "facts-run")
    if result.unreachable:
        raise Unreachable(f"gathering facts: cannot reach {', '.join(result.unreachable)}; see {result.run_dir}")
    if result.status != "successful":
        detail = "; ".join(f"{h}: {' '.join(r.messages)}" for h, r in result.hosts.items() if r.failed)
        raise PycliError(f"gathering facts failed: {detail or result.status}; see {result.run_dir}")
    return {host: node_facts_from_json(json.loads((facts_dir / f"{host}.json").read_text())) for host in hosts}
