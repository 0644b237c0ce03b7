"""`pycli top` from Prometheus: one SSH round to the monitoring host per refresh, where a small
Python program asks Prometheus's HTTP API (on the address the monitoring role recorded in its
local fact: it listens on the cluster network only) for every figure at once and prints the
answers as JSON; here they become NodeSamples.

Node figures come from node-exporter, GPU figures from dcgm-exporter (its `hpc_job` label is
the Slurm job holding the GPU); every series carries `node`, the inventory name (the role's
scrape configuration). A node Prometheus cannot scrape is down as of its last scrape.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from pycli.top.model import GpuSample, NodeSample
from pycli_node.gpu_reports import slowdowns_of

# What each figure is, in PromQL. Rates over a minute: at least four scrapes at the role's
# default interval of 15 s.
QUERIES: Mapping[str, str] = {
    "up": 'up{job="node"}',
    "age": 'time() - timestamp(up{job="node"})',
    # Busy share of every core: 1 - (idle + iowait seconds per second) / cores.
    "cpu": '100 * (1 - sum by (node) (rate(node_cpu_seconds_total{job="node", mode=~"idle|iowait"}[1m])) '
           '/ count by (node) (node_cpu_seconds_total{job="node", mode="idle"}))',
    "mem_total": 'node_memory_MemTotal_bytes{job="node"}',
    "mem_available": 'node_memory_MemAvailable_bytes{job="node"}',
    "rx": 'sum by (node) (rate(node_network_receive_bytes_total{job="node", device!="lo"}[1m]))',
    "tx": 'sum by (node) (rate(node_network_transmit_bytes_total{job="node", device!="lo"}[1m]))',
    "dcgm_up": 'up{job="dcgm"}',
    "gpu_util": 'DCGM_FI_DEV_GPU_UTIL{job="dcgm"}',
    "fb_used": 'DCGM_FI_DEV_FB_USED{job="dcgm"}',
    "fb_free": 'DCGM_FI_DEV_FB_FREE{job="dcgm"}',
    "gpu_temp": 'DCGM_FI_DEV_GPU_TEMP{job="dcgm"}',
    "power": 'DCGM_FI_DEV_POWER_USAGE{job="dcgm"}',
    "xid": 'DCGM_FI_DEV_XID_ERRORS{job="dcgm"}',
    "ecc_dbe": 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job="dcgm"}',
    "clocks": 'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{job="dcgm"}',
}
# Seconds each query may take on the monitoring host.
QUERY_TIMEOUT_S = 4
# Where the monitoring role records where Prometheus listens, on the monitoring host: its local
# fact `monitoring` (roles/monitoring/README.md), in Ansible's folder of local facts (fact_path's default).
MONITORING_FACT = "/etc/ansible/facts.d/monitoring.fact"

# Runs on the monitoring host with its own python3 (standard library only).
_PROGRAM = """
import json, sys, urllib.parse, urllib.request
queries, fact = json.loads(sys.argv[1]), sys.argv[2]
try:
    with open(fact) as stream:
        address = str(json.load(stream)["prometheus_address"])
except (OSError, ValueError, KeyError, TypeError) as exc:
    print(json.dumps({"error": "%%s is missing or unreadable (%%s): provision the cluster again" %% (fact, exc)}))
    sys.exit(0)
host, _, port = address.rpartition(":")
if host in ("", "0.0.0.0", "[::]"):
    address = "localhost:" + port
answers = {"address": address}
for name, query in queries.items():
    url = "http://" + address + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=%(timeout)d) as reply:
            answers[name] = json.load(reply)["data"]["result"]
    except Exception as exc:
        answers[name] = {"error": str(exc)}
print(json.dumps(answers))
"""


def query_command() -> str:
    """The shell line that asks Prometheus on its host and prints its answers (one JSON line)."""
    program = _PROGRAM % {"timeout": QUERY_TIMEOUT_S}
    return f"python3 -c {shlex.quote(program)} {shlex.quote(json.dumps(dict(QUERIES)))} {shlex.quote(MONITORING_FACT)}"


class PrometheusUnavailable(Exception):
    """Prometheus gave no answer this refresh (the message says why)."""


@dataclass(frozen=True)
class _Series:
    labels: Mapping[str, str]
    value: float


def _series(answers: Mapping[str, object], name: str) -> list[_Series]:
    result = answers.get(name)
    if not isinstance(result, list):
        return []
    series = []
    for item in result:
        try:
            series.append(_Series(item.get("metric", {}), float(item["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            continue
    return series


def _by_node(answers: Mapping[str, object], name: str) -> dict[str, float]:
    return {s.labels["node"]: s.value for s in _series(answers, name) if "node" in s.labels}


def parse_answers(stdout: str, node_names: list[str]) -> dict[str, NodeSample]:
    """Every node's sample from the JSON query_command printed; PrometheusUnavailable when
    Prometheus answered none of it."""
    try:
        answers = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except (ValueError, IndexError):
        answers = None
    if not isinstance(answers, dict):
        raise PrometheusUnavailable(f"no answer from the query program: {stdout.strip()[:200] or 'nothing printed'}")
    if "error" in answers:
        raise PrometheusUnavailable(str(answers["error"]))
    up = answers.get("up")
    if not isinstance(up, list):
        why = up.get("error") if isinstance(up, dict) else "no answer"
        raise PrometheusUnavailable(f"Prometheus at {answers.get('address')} did not answer: {why}")
    ups, ages = _by_node(answers, "up"), _by_node(answers, "age")
    cpu, total, available = _by_node(answers, "cpu"), _by_node(answers, "mem_total"), _by_node(answers, "mem_available")
    rx, tx, dcgm_up = _by_node(answers, "rx"), _by_node(answers, "tx"), _by_node(answers, "dcgm_up")
    gpus = _gpus(answers)
    samples = {}
    for name in node_names:
        age = ages.get(name)
        if name not in ups:
            samples[name] = NodeSample(name, False, "Prometheus does not scrape it (provision again to add it)")
            continue
        if ups[name] < 1:
            when = f" ({age:.0f} s ago)" if age is not None else ""
            samples[name] = NodeSample(name, False, f"Prometheus could not scrape it{when}", age_s=age)
            continue
        mem_total, mem_available = total.get(name), available.get(name)
        gpu_error = "dcgm-exporter not answering Prometheus" if dcgm_up.get(name, 1) < 1 else ""
        samples[name] = NodeSample(
            name, True, cpu_pct=cpu.get(name),
            mem_used_bytes=mem_total - mem_available if mem_total is not None and mem_available is not None else None,
            mem_total_bytes=mem_total,
            net_rx_bps=rx.get(name), net_tx_bps=tx.get(name), gpus=tuple(gpus.get(name, ())),
            gpu_error=gpu_error, age_s=age,
        )
    return samples


@dataclass
class _GpuFigures:
    name: str
    uuid: str
    values: dict[str, float] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)

    def sample(self, index: int) -> GpuSample:
        get = self.values.get
        used, free, xid, ecc, clocks = get("fb_used"), get("fb_free"), get("xid"), get("ecc_dbe"), get("clocks")
        return GpuSample(
            index=index, name=self.name, uuid=self.uuid, util_pct=get("gpu_util"), mem_used_mib=used,
            mem_total_mib=used + free if used is not None and free is not None else None,
            temp_c=get("gpu_temp"), power_w=get("power"),
            last_xid=int(xid) if xid is not None else None, ecc_uncorrected=int(ecc) if ecc is not None else None,
            slowdowns=slowdowns_of(int(clocks)) if clocks is not None else (), jobs=tuple(self.jobs),
        )


def _gpus(answers: Mapping[str, object]) -> dict[str, list[GpuSample]]:
    """node -> its GPUs, from dcgm-exporter's series (labels gpu, UUID, modelName, hpc_job)."""
    figures: dict[tuple[str, int], _GpuFigures] = {}
    for name in ("gpu_util", "fb_used", "fb_free", "gpu_temp", "power", "xid", "ecc_dbe", "clocks"):
        for s in _series(answers, name):
            node, gpu = s.labels.get("node"), str(s.labels.get("gpu", ""))
            if not node or not gpu.isdigit():
                continue
            entry = figures.setdefault((node, int(gpu)), _GpuFigures(s.labels.get("modelName", ""), s.labels.get("UUID", "")))
            entry.values[name] = s.value
            job = s.labels.get("hpc_job", "")
            if job and job not in entry.jobs:
                entry.jobs.append(job)
    by_node: dict[str, list[GpuSample]] = {}
    for (node, index), entry in sorted(figures.items()):
        by_node.setdefault(node, []).append(entry.sample(index))
    return by_node
