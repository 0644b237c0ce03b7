"""`pycli top` without Prometheus: one SSH round per refresh, one command per node, and what
its answer says (a NodeSample). The command reads the kernel's own counters twice, half a
second apart (CPU and network rates need two readings), the memory figures, the processes of
pycli's jobs, and where nvidia-smi exists the GPUs (`--query-gpu` as CSV), the processes on
them and this boot's Xid reports (the GPU health probe's reader, pycli_node.gpu_probe).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import replace
from pathlib import PurePosixPath

from pycli.cluster.nodes import NodeOutput
from pycli.jobs.launch import job_process_pattern
from pycli.top.model import GpuSample, NodeSample, with_jobs
from pycli_node.gpu_probe import MARK, Section, split_sections, xid_lines
from pycli_node.gpu_reports import Xid, parse_xids, slowdowns_of

# Seconds between the two readings of /proc/stat and /proc/net/dev.
SAMPLE_S = 0.5
# The GPU fields asked for, in this order (tests/fixtures/recorded/nvidia-smi-query-gpu-*.csv).
GPU_FIELDS = ("index", "uuid", "name", "pci.bus_id", "utilization.gpu", "memory.used", "memory.total",
              "temperature.gpu", "power.draw", "power.limit", "ecc.errors.uncorrected.volatile.total",
              # the older name of clocks_event_reasons.active, which drivers before 535 do not know
              "clocks_throttle_reasons.active")
APP_FIELDS = ("gpu_uuid", "pid")


def probe_command(jobs_dir: PurePosixPath, extra: str = "") -> str:
    """The node's side; `extra`: more sections to run after it (Slurm's, on one node)."""
    pattern = shlex.quote(job_process_pattern(jobs_dir))
    lines = [
        f"echo '{MARK} t0'; head -1 /proc/stat; cat /proc/net/dev",
        f"sleep {SAMPLE_S}",
        f"echo '{MARK} t1'; head -1 /proc/stat; cat /proc/net/dev",
        f"echo '{MARK} mem'; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo",
        f"echo '{MARK} jobs'; pgrep -af {pattern}; echo \"{MARK} rc 0\"",
        "if command -v nvidia-smi >/dev/null 2>&1; then",
        f"echo '{MARK} gpu'; nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits 2>&1; "
        f"echo \"{MARK} rc $?\"",
        f"echo '{MARK} apps'; nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,noheader,nounits 2>&1; "
        f"echo \"{MARK} rc $?\"",
        *xid_lines(),
        "fi",
    ]
    if extra:
        lines.append(extra)
    return "\n".join(lines)


def _cpu_ticks(text: str) -> tuple[int, int] | None:
    """(busy, total) jiffies of the `cpu` line of /proc/stat."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu" and all(f.isdigit() for f in fields[1:]) and len(fields) > 5:
            values = [int(f) for f in fields[1:]]
            idle = values[3] + values[4]  # idle + iowait
            total = sum(values[:8])  # guest time is counted in user already
            return total - idle, total
    return None


def _net_bytes(text: str) -> tuple[int, int] | None:
    """(received, sent) bytes of every interface but lo, from /proc/net/dev."""
    rx = tx = 0
    seen = False
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        fields = rest.split()
        if not colon or name.strip() in ("lo", "") or len(fields) < 9 or not fields[0].isdigit():
            continue
        rx, tx, seen = rx + int(fields[0]), tx + int(fields[8]), True
    return (rx, tx) if seen else None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_query_gpu(text: str) -> list[GpuSample]:
    """GPUs from `nvidia-smi --query-gpu=GPU_FIELDS --format=csv,noheader,nounits` (a header line is skipped)."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(GPU_FIELDS) or not cells[0].isdigit():
            continue
        row = dict(zip(GPU_FIELDS, cells, strict=True))
        ecc = _number(row["ecc.errors.uncorrected.volatile.total"])
        gpus.append(GpuSample(
            index=int(row["index"]), name=row["name"], uuid=row["uuid"],
            util_pct=_number(row["utilization.gpu"]), mem_used_mib=_number(row["memory.used"]),
            mem_total_mib=_number(row["memory.total"]), temp_c=_number(row["temperature.gpu"]),
            power_w=_number(row["power.draw"]), power_limit_w=_number(row["power.limit"]),
            ecc_uncorrected=int(ecc) if ecc is not None else None, slowdowns=_slowdowns(row["clocks_throttle_reasons.active"]),
        ))
    return gpus


def _slowdowns(cell: str) -> tuple[str, ...]:
    try:
        return slowdowns_of(int(cell, 16))
    except ValueError:
        return ()  # "[N/A]"


def parse_apps(text: str) -> dict[str, list[int]]:
    """GPU UUID -> the PIDs on it, from `--query-compute-apps=APP_FIELDS` (header lines skipped)."""
    on: dict[str, list[int]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) >= 2 and cells[1].isdigit():
            on.setdefault(cells[0], []).append(int(cells[1]))
    return on


def parse_job_processes(text: str, jobs_dir: PurePosixPath) -> dict[int, str]:
    """PID -> pycli job id, from `pgrep -af` lines whose command line names a job's folder."""
    folder = re.compile(re.escape(str(jobs_dir)) + r"/([A-Za-z0-9_.-]+)")
    found = {}
    for line in text.splitlines():
        pid, _, command = line.strip().partition(" ")
        if pid.isdigit() and (match := folder.search(command)):
            found[int(pid)] = match.group(1)
    return found


def _bus_key(bus_id: str) -> str:
    """"00000000:3B:00.0" (nvidia-smi) and "PCI:0000:3b:00" (the kernel's Xid lines) alike: "3b:00"."""
    parts = bus_id.lower().replace("pci:", "").split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus_id.lower()


def _gpu_bus_ids(text: str) -> dict[int, str]:
    ids = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == len(GPU_FIELDS) and cells[0].isdigit():
            ids[int(cells[0])] = cells[GPU_FIELDS.index("pci.bus_id")]
    return ids


def node_sample(name: str, sections: Mapping[str, Section], jobs_dir: PurePosixPath) -> NodeSample:
    """What a node's answer to probe_command says."""
    before, after = sections.get("t0"), sections.get("t1")
    cpu_pct = rx = tx = None
    if before and after:
        ticks0, ticks1 = _cpu_ticks(before.text), _cpu_ticks(after.text)
        if ticks0 and ticks1 and ticks1[1] > ticks0[1]:
            cpu_pct = 100.0 * (ticks1[0] - ticks0[0]) / (ticks1[1] - ticks0[1])
        net0, net1 = _net_bytes(before.text), _net_bytes(after.text)
        if net0 and net1:
            rx, tx = (max(0, b - a) / SAMPLE_S for a, b in zip(net0, net1, strict=True))
    memory = {}
    for line in sections["mem"].text.splitlines() if "mem" in sections else ():
        key, _, value = line.partition(":")
        if value.split() and value.split()[0].isdigit():
            memory[key] = int(value.split()[0]) * 1024
    total, available = memory.get("MemTotal"), memory.get("MemAvailable")
    processes = parse_job_processes(sections["jobs"].text, jobs_dir) if "jobs" in sections else {}
    gpus: list[GpuSample] = []
    gpu_error = ""
    if "gpu" in sections:
        section = sections["gpu"]
        gpus = parse_query_gpu(section.text)
        if section.rc != 0 or not gpus:
            gpu_error = f"nvidia-smi: {section.text.strip().splitlines()[-1] if section.text.strip() else f'exit {section.rc}'}"
        pids = parse_apps(sections["apps"].text) if "apps" in sections else {}
        buses = {index: _bus_key(bus) for index, bus in _gpu_bus_ids(section.text).items()}
        xids = parse_xids(sections["xid"].text) if "xid" in sections else []
        gpus = [_with_xids(with_jobs(gpu, [processes[p] for p in pids.get(gpu.uuid, []) if p in processes]),
                           [x for x in xids if _bus_key(x.device) == buses.get(gpu.index)])
                for gpu in gpus]
    return NodeSample(
        name, True, cpu_pct=cpu_pct,
        mem_used_bytes=total - available if total is not None and available is not None else None,
        mem_total_bytes=total, net_rx_bps=rx, net_tx_bps=tx, gpus=tuple(gpus), gpu_error=gpu_error,
        jobs=tuple(dict.fromkeys(processes.values())), age_s=0.0,
    )


def _with_xids(gpu: GpuSample, xids: list[Xid]) -> GpuSample:
    return replace(gpu, xid_count=sum(x.count for x in xids), last_xid=xids[-1].code if xids else 0)


def samples_from_answers(answers: Mapping[str, NodeOutput], jobs_dir: PurePosixPath) -> dict[str, NodeSample]:
    """Each node's sample from its answer to probe_command; a node whose answer did not get
    through is down, with the reason (ssh's complaint, or no answer in time)."""
    samples = {}
    for name, answer in answers.items():
        sections = split_sections(answer.stdout)
        if "t1" not in sections or "mem" not in sections:
            samples[name] = NodeSample(name, False, answer.stderr.strip().splitlines()[-1] if answer.stderr.strip()
                                       else answer.why())
            continue
        samples[name] = node_sample(name, sections, jobs_dir)
    return samples
