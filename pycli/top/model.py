"""What `pycli top` shows of each node, whichever source read it: the figures of one moment
(NodeSample, from pycli/top/probe.py over SSH or pycli/top/prometheus.py), what the cluster
says of the node beside them (pycli's drained list, Slurm's state and jobs), how bad a node
looks (worst first), and the JSON of a frame. Pure: nothing here reaches a node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from pycli.cluster.model import Cluster
from pycli.cluster.slurm_nodes import NodeState

# A GPU this hot (degrees C) counts against its node in the worst-first order and shows red.
HOT_C = 85.0


@dataclass(frozen=True)
class GpuSample:
    """One GPU as nvidia-smi or dcgm-exporter reported it; None where the source gives nothing."""

    index: int
    name: str = ""
    uuid: str = ""
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    xid_count: int | None = None  # Xid reports this boot (SSH); None where the source counts none
    last_xid: int | None = None  # the code of the latest Xid (0 or None: none)
    ecc_uncorrected: int | None = None  # uncorrectable (double-bit) volatile ECC errors
    slowdowns: tuple[str, ...] = ()  # clock event reasons active now that are slowdowns (gpu_reports.SLOWDOWN_BITS)
    jobs: tuple[str, ...] = ()  # pycli's job ids (SSH) or Slurm's (dcgm-exporter's hpc_job)

    @property
    def problem(self) -> str:
        """What is wrong with it, "" when nothing is."""
        faults = []
        if self.last_xid:
            faults.append(f"Xid {self.last_xid}")
        if self.ecc_uncorrected:
            faults.append(f"{self.ecc_uncorrected} uncorrectable ECC")
        if self.slowdowns:
            faults.append(f"clocks held down by {', '.join(self.slowdowns)}")
        if self.temp_c is not None and self.temp_c >= HOT_C:
            faults.append(f"{self.temp_c:.0f} C")
        return ", ".join(faults)


@dataclass(frozen=True)
class NodeSample:
    """One node at one moment. `up` False: it did not answer (`why` says how)."""

    name: str
    up: bool
    why: str = ""
    cpu_pct: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    net_rx_bps: float | None = None  # bytes per second, every interface but lo
    net_tx_bps: float | None = None
    gpus: tuple[GpuSample, ...] = ()
    gpu_error: str = ""  # nvidia-smi or dcgm-exporter failed on a node that has GPUs
    jobs: tuple[str, ...] = ()  # pycli's jobs with processes on the node (SSH)
    age_s: float | None = None  # how old the figures are (Prometheus: since its last scrape)


@dataclass(frozen=True)
class NodeView:
    """A node's sample with what the cluster says of it."""

    sample: NodeSample
    drained: str = ""  # pycli's drained list: the reason
    slurm_state: str = ""  # sinfo's long state; "" without Slurm
    slurm_reason: str = ""
    slurm_jobs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.sample.name

    @property
    def jobs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.sample.jobs, *self.slurm_jobs)))

    @property
    def state(self) -> str:
        """One word or two: down, drained, Slurm's word where it has one, else up."""
        if not self.sample.up:
            return "down"
        if self.drained:
            return "drained"
        if self.slurm_state:
            return self.slurm_state
        return "up"

    @property
    def severity(self) -> int:
        """3 down, 2 a GPU in trouble, 1 drained or out of Slurm's service, 0 well."""
        sample = self.sample
        if not sample.up:
            return 3
        if sample.gpu_error or any(gpu.problem for gpu in sample.gpus):
            return 2
        slurm_out = self.slurm_state.rstrip("*~#!%$@^-").split("+")[0] in ("down", "drained", "draining", "fail", "failing")
        if self.drained or slurm_out:
            return 1
        return 0

    def sort_key(self) -> tuple[int, float, float, str]:
        hottest = max((gpu.temp_c or 0.0 for gpu in self.sample.gpus), default=0.0)
        return (-self.severity, -hottest, -(self.sample.cpu_pct or 0.0), self.name)

    def as_json(self) -> dict[str, object]:
        document = asdict(self.sample)
        document["gpus"] = [asdict(gpu) | {"problem": gpu.problem} for gpu in self.sample.gpus]
        document.update(state=self.state, drained=self.drained, slurm_state=self.slurm_state,
                        slurm_reason=self.slurm_reason, jobs=list(self.jobs))
        return document


@dataclass(frozen=True)
class Frame:
    """One refresh: every node in inventory order, and where the figures came from."""

    source: str  # "prometheus" or "ssh"
    source_line: str  # says which, in words ("Prometheus on node1", "SSH, one round per refresh")
    nodes: tuple[NodeView, ...]
    notes: tuple[str, ...] = ()  # what could not be read this time (Slurm, Prometheus)
    taken_s: float = 0.0  # how long reading it took
    at: str = ""  # UTC, ISO 8601

    def worst_first(self) -> list[NodeView]:
        return sorted(self.nodes, key=NodeView.sort_key)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.state] = counts.get(node.state, 0) + 1
        return counts

    def as_json(self) -> dict[str, object]:
        return {"at": self.at, "source": self.source, "source_line": self.source_line, "taken_s": round(self.taken_s, 2),
                "notes": list(self.notes), "nodes": [node.as_json() for node in self.nodes]}


@dataclass(frozen=True)
class ClusterSide:
    """What the cluster says of its nodes besides their figures."""

    slurm: Mapping[str, NodeState] = field(default_factory=dict)
    slurm_jobs: Mapping[str, Sequence[str]] = field(default_factory=dict)


def node_views(cluster: Cluster, samples: Mapping[str, NodeSample], side: ClusterSide) -> tuple[NodeView, ...]:
    """Every host of the cluster in inventory order; one without a sample is down (`why` unknown)."""
    drained = {entry.node: entry.reason for entry in cluster.drained}
    views = []
    for host in cluster.hosts:
        sample = samples.get(host.name) or NodeSample(host.name, False, "no answer")
        state = side.slurm.get(host.name)
        views.append(NodeView(
            sample, drained=drained.get(host.name, ""),
            slurm_state=state.state if state else "",
            slurm_reason=state.reason if state and state.reason not in ("none", "") else "",
            slurm_jobs=tuple(side.slurm_jobs.get(host.name, ())),
        ))
    return tuple(views)


def with_jobs(gpu: GpuSample, jobs: Sequence[str]) -> GpuSample:
    return replace(gpu, jobs=tuple(dict.fromkeys(jobs)))
