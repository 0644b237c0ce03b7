"""`pycli check --deep`: which node is slow and which link, by measurement.

Two gates after the usual ones, each comparing every figure with the median of the others
(so one sick node among three still stands out, and a whole slow cluster is no outlier):

- compute: every node at once runs a fixed float32 matrix multiply for a fixed time, on each
  of its GPUs or else on its CPU cores; a node's figure is its slowest device's GFLOP/s.
- links: every pair of nodes measures TCP with iperf3 both ways at once (a pair's figure is
  its slower direction), then a two-rank allreduce between the two (torch.distributed: NCCL
  on the first GPU of each, else Gloo on the CPU; its bus bandwidth), in rounds of disjoint
  pairs (the circle method: N-1 rounds of N/2 pairs for N nodes, N rounds for odd N with one
  node idle each round), so each node carries one measurement at a time and the rounds grow
  linearly with N.

A node below `compute_fraction` of the others' median in two rounds is named, and so is a pair below
`link_fraction` of the other pairs' median; a node all of whose links are named is itself a
suspect. `--fence` puts the suspects on the drained list (pycli/cluster/drained.py). The figures go
to `deep.json`, the pair matrices to `links.png` (TCP) and `allreduce.png` (heat maps), the
compute figures to `compute.png` (pycli/health/plots.py). The GPUs' own reports are the gate of
pycli/health/gpu_health.py.
"""

from __future__ import annotations

import functools
import io
import json
import shlex
import statistics
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from pycli.cluster.iperf import parse_iperf3, tcp_client_command, tcp_server_command, tcp_stop_command
from pycli.cluster.model import INTERFACE_VAR, Host
from pycli.cluster.nodes import ssh_each
from pycli.core.paths import WORKLOADS_DIR
from pycli.health.figures import Link
from pycli.health.gates import CheckContext, Gate, GateResult, failed, passed, skipped
from pycli.health.gpu_health import gate_gpu_health
from pycli.health.plots import plot_compute, plot_links
from pycli.jobs.files import folder_files
from pycli.jobs.launch import socket_interface_env

Key = TypeVar("Key")  # what ratios_to_others compares: nodes by name, pairs of them

# The probes are files of the workloads folder; pair_allreduce.py takes its busbw arithmetic
# from allreduce.py, so the folder travels whole (probe_bundle), as a built-in job's does.
COMPUTE_PROBE = WORKLOADS_DIR / "compute_probe.py"
PAIR_ALLREDUCE_PROBE = WORKLOADS_DIR / "pair_allreduce.py"
PAIR_ALLREDUCE_BYTES = 16 * 2**20
PAIR_ALLREDUCE_ITERS = 3
COMPUTE_ROUNDS = 2  # gate_compute: a node is named when it is slow in both rounds
PAIR_ALLREDUCE_PORT = 29431  # rank 0's rendezvous port on the second node of each pair


def probe_bundle() -> bytes:
    """The workloads folder as a gzipped tar, the stdin of every probe command (probe_command)."""
    return _bundle_of(WORKLOADS_DIR)


@functools.cache
def _bundle_of(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, path in folder_files(folder):
            tar.add(path, arcname=name, recursive=False)
    return buffer.getvalue()


def probe_command(python: str, probe: Path, args: Sequence[object], interface: str | None = None) -> str:
    """The shell line that runs `probe` on a node: the workloads folder unpacked from stdin
    (probe_bundle) into a folder of its own, removed when the probe ends, so nothing of the
    check stays on the node; Gloo and NCCL on the inventory's NIC when it names one."""
    run = shlex.join(["env", *socket_interface_env(interface), python, probe.name, *map(str, args)])
    return f'd=$(mktemp -d) || exit 1; trap \'rm -rf -- "$d"\' EXIT; tar -xzf - -C "$d" && cd -- "$d" && {run}'


def pair_allreduce_command(python: str, rank: int, master: str, port: int, interface: str | None) -> str:
    """One rank of a pair's allreduce; the ranks talk over the inventory's NIC when it names one."""
    return probe_command(python, PAIR_ALLREDUCE_PROBE, [rank, master, port, PAIR_ALLREDUCE_BYTES, PAIR_ALLREDUCE_ITERS],
                         interface)


def parse_pair_allreduce(stdout: str) -> float:
    """The rank's bus bandwidth in GB/s; ValueError when its last line is not the probe's."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        value = json.loads(lines[-1])["busbw_gbps"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise ValueError(f"no allreduce figure: {lines[-1][:120] if lines else 'nothing printed'}") from None
    if not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"no allreduce figure: {lines[-1][:120]}")
    return float(value)


def compute_command(python: str, seconds: float) -> str:
    return probe_command(python, COMPUTE_PROBE, [seconds])


def parse_compute(stdout: str) -> dict[str, float]:
    """The probe's figures per device; ValueError when its last line is not them."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the compute probe printed nothing")
    data = json.loads(lines[-1])
    if not isinstance(data, dict) or not data or not all(isinstance(v, (int, float)) for v in data.values()):
        raise ValueError(f"not the compute probe's figures: {lines[-1][:100]}")
    return {str(k): float(v) for k, v in data.items()}


def ratios_to_others(values: Mapping[Key, float]) -> dict[Key, float]:
    """Each value over the median of all the others (empty with fewer than two values)."""
    if len(values) < 2:
        return {}
    ratios = {}
    for key, value in values.items():
        others = statistics.median(v for k, v in values.items() if k != key)
        ratios[key] = value / others if others > 0 else float("inf")
    return ratios


def pair_rounds(names: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Every pair of `names` once, in rounds of disjoint pairs (the circle method)."""
    ring = list(names) + ([None] if len(names) % 2 else [])
    count = len(ring)
    rounds = []
    for _ in range(count - 1):
        pairs = [(ring[i], ring[count - 1 - i]) for i in range(count // 2)]
        rounds.append([(a, b) if names.index(a) < names.index(b) else (b, a) for a, b in pairs if a and b])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


# --- compute ----------------------------------------------------------------------------------


def evaluate_compute(figures: Mapping[str, float], failures: Mapping[str, str],
                     fraction: float) -> tuple[GateResult, dict[str, str]]:
    """The compute gate from each node's GFLOP/s; the suspects, node -> why."""
    if failures:
        detail = "; ".join(f"{name}: {why}" for name, why in failures.items())
        return failed("compute", f"the compute probe did not run: {detail}"), {}
    ratios = ratios_to_others(figures)
    slow = {name: f"compute {ratio:.2f} of the median" for name, ratio in ratios.items() if ratio < fraction}
    shown = ", ".join(f"{name} {figures[name]:.1f}" for name in figures)
    if slow:
        return failed("compute", "; ".join(f"{name}: {why}" for name, why in slow.items())
                      + f" (below {fraction:g}); look at its cooling, clocks and CPU limits, or drain it",
                      f"GFLOP/s {shown}"), slow
    if not ratios:
        return passed("compute", f"GFLOP/s {shown} (one node: nothing to compare with)"), {}
    return passed("compute", f"GFLOP/s {shown}; every node at least {fraction:g} of the others' median"), {}


def gate_compute(ctx: CheckContext) -> GateResult:
    """Every node measured; when one is below the fraction, every node measured again, each
    keeping its better figure: a node is named only when it is slow in both rounds, so a
    moment's noise on a node (a cron job, the hypervisor, another tenant of a shared machine)
    names nobody, and a node held to a fraction of its clock is slow each time."""
    figures: dict[str, float] = {}
    devices: dict[str, dict[str, float]] = {}
    failures: dict[str, str] = {}
    rounds = 0
    while True:
        rounds += 1
        for name, measured in _measure_compute(ctx).items():
            if isinstance(measured, str):
                failures[name] = measured
            elif min(measured.values()) > figures.get(name, 0.0):
                devices[name], figures[name] = measured, min(measured.values())
        result, suspects = evaluate_compute(figures, failures, ctx.options.compute_fraction)
        if failures or not suspects or rounds == COMPUTE_ROUNDS:
            break
    notes = []
    if ctx.cluster.nodes_share_cpus:
        notes.append("one node at a time: they share this machine's cores")
    if rounds > 1 and not failures:
        notes.append(f"each node's best of {rounds} rounds")
    if notes and result.figure:
        result = replace(result, figure=f"{result.figure} ({'; '.join(notes)})")
    ctx.deep["compute"] = {"gflops": figures, "devices": devices, "ratios": ratios_to_others(figures), "rounds": rounds}
    ctx.suspects.update(suspects)
    if figures:
        plot_compute(figures, set(suspects), ctx.run_dir / "compute.png")
    return result


def _measure_compute(ctx: CheckContext) -> dict[str, dict[str, float] | str]:
    """One round of the compute probe: each node's GFLOP/s per device, or why it gave none."""
    from pycli.jobs.train import layout_of

    hosts = ctx.cluster.hosts
    command = compute_command(layout_of(ctx.cluster).python, ctx.options.compute_seconds)
    # Nodes that share a machine's cores measure one at a time; separate machines all at once.
    batches = [[h] for h in hosts] if ctx.cluster.nodes_share_cpus else [list(hosts)]
    answers = {}
    for batch in batches:
        answers.update(ssh_each([(h, command) for h in batch], timeout_s=120 + 4 * ctx.options.compute_seconds,
                                stdin=probe_bundle()))
    measured: dict[str, dict[str, float] | str] = {}
    for host in hosts:
        answer = answers[host.name]
        try:
            if not answer.ok:
                raise ValueError(answer.why())
            measured[host.name] = parse_compute(answer.stdout)
        except ValueError as exc:
            measured[host.name] = str(exc)
    return measured


# --- links ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairProbe:
    """How the link gate reaches the pairs' nodes: the venv's Python, the NIC, a round's port."""

    python: str
    interface: str | None
    seconds: int


def measure_round(pairs: Sequence[tuple[Host, Host]], probe: PairProbe, port: int) -> list[Link]:
    """TCP, then the allreduce, over every pair of a round at once."""
    links = measure_tcp(pairs, probe.seconds)
    reached = {(link.a, link.b) for link in links if link.gbit_per_s is not None}
    ranks = [(server, client) for client, server in pairs if (client.name, server.name) in reached]
    figures = measure_allreduce(ranks, probe, port)
    return [replace(link, allreduce_gbps=figures[(link.a, link.b)][0], allreduce_note=figures[(link.a, link.b)][1])
            if (link.a, link.b) in figures else link for link in links]


def measure_allreduce(pairs: Sequence[tuple[Host, Host]], probe: PairProbe, port: int
                      ) -> dict[tuple[str, str], tuple[float | None, str]]:
    """A two-rank allreduce on every (rank 0, rank 1) pair at once; (client, server) -> (GB/s, why not)."""
    commands = []
    for first, second in pairs:
        commands += [(first, pair_allreduce_command(probe.python, 0, first.address, port, probe.interface)),
                     (second, pair_allreduce_command(probe.python, 1, first.address, port, probe.interface))]
    answers = ssh_each(commands, timeout_s=150, stdin=probe_bundle())
    figures: dict[tuple[str, str], tuple[float | None, str]] = {}
    for first, second in pairs:
        try:
            for host in (first, second):
                if not answers[host.name].ok:
                    raise ValueError(f"allreduce rank on {host.name}: {answers[host.name].why()}")
            busbw = min(parse_pair_allreduce(answers[host.name].stdout) for host in (first, second))
            figures[(second.name, first.name)] = (busbw, "")
        except ValueError as exc:
            figures[(second.name, first.name)] = (None, str(exc))
    return figures


def measure_tcp(pairs: Sequence[tuple[Host, Host]], seconds: int) -> list[Link]:
    """iperf3 over every pair of a round at once: a server on the second, the client on the first."""
    started = ssh_each([(server, tcp_server_command(seconds)) for _, server in pairs])
    links, clients, stops = [], [], []
    for client, server in pairs:
        answer = started[server.name]
        folder = answer.stdout.strip().splitlines()[-1] if answer.ok and answer.stdout.strip() else ""
        try:
            stops.append((server, tcp_stop_command(folder)))
        except ValueError:
            links.append(Link(client.name, server.name, None, f"iperf3 -s on {server.name}: {answer.why()}"))
            continue
        clients.append((client, server, tcp_client_command(server.address, seconds, both_ways=True)))
    try:
        measured = ssh_each([(client, line) for client, _, line in clients], timeout_s=60 + 6 * seconds)
    finally:
        ssh_each(stops)
    for client, server, _ in clients:
        try:
            links.append(Link(client.name, server.name, parse_iperf3(measured[client.name].stdout) / 1e9))
        except (ValueError, KeyError) as exc:
            links.append(Link(client.name, server.name, None, f"iperf3 -c on {client.name}: {exc}"))
    return links


def evaluate_links(names: Sequence[str], links: Sequence[Link], fraction: float) -> tuple[GateResult, dict[str, str]]:
    """The links gate from every pair's figures; the suspects: nodes all of whose links are slow.

    A pair is slow when its TCP is below `fraction` of the other pairs' median, or its allreduce
    is (where the allreduce was measured)."""
    broken = [f"{link.a} <-> {link.b}: {link.note or link.allreduce_note}"
              for link in links if link.gbit_per_s is None or link.allreduce_note]
    if broken:
        return failed("links", "; ".join(broken)), {}
    speeds = {(link.a, link.b): float(link.gbit_per_s or 0) for link in links}
    reduced = {(link.a, link.b): link.allreduce_gbps for link in links if link.allreduce_gbps is not None}
    shown = f"{len(links)} pair(s), TCP {min(speeds.values(), default=0):.2f} to {max(speeds.values(), default=0):.2f} Gbit/s"
    if reduced:
        shown += f", allreduce {min(reduced.values()):.3g} to {max(reduced.values()):.3g} GB/s busbw"
    if len(names) < 3:
        return passed("links", f"{shown} (fewer than 3 nodes: no other pair to compare with)"), {}
    tcp_ratios, allreduce_ratios = ratios_to_others(speeds), ratios_to_others(reduced)
    said = {}
    for pair in speeds:
        parts = []
        if tcp_ratios[pair] < fraction:
            parts.append(f"{tcp_ratios[pair]:.0%} of the median link")
        if pair in allreduce_ratios and allreduce_ratios[pair] < fraction:
            parts.append(f"allreduce {allreduce_ratios[pair]:.0%} of the median pair")
        if parts:
            said[pair] = ", ".join(parts)
    if not said:
        return passed("links", f"{shown}; every pair at least {fraction:g} of the others' median"), {}
    suspects = {}
    for name in names:
        mine = [pair for pair in speeds if name in pair]
        if mine and all(pair in said for pair in mine):
            worst = min(min(tcp_ratios[p], allreduce_ratios.get(p, 1.0)) for p in mine)
            suspects[name] = f"every link at most {worst:.0%} of the median link"
    message = "; ".join(f"{a} <-> {b}: {why}" for (a, b), why in said.items())
    through = f"; every slow pair goes through {', '.join(suspects)}" if suspects else ""
    return failed("links", f"{message}{through}; look at the cable, the port and its speed, or drain the node", shown), suspects


def gate_links(ctx: CheckContext) -> GateResult:
    from pycli.jobs.train import layout_of

    hosts = {h.name: h for h in ctx.cluster.hosts}
    names = list(hosts)
    if len(names) < 2:
        return skipped("links", "one node: no link to measure")
    probe = PairProbe(layout_of(ctx.cluster).python, ctx.cluster.settings.get(INTERFACE_VAR), ctx.options.link_seconds)
    links = []
    rounds = pair_rounds(names)
    if ctx.cluster.nodes_share_cpus:  # iperf3 and Gloo are CPU-bound: pairs sharing cores would slow each other
        rounds = [[pair] for pairs in rounds for pair in pairs]
    for index, pairs in enumerate(rounds):
        # A port of its own per round: the last round's rendezvous may still hold its port.
        links += measure_round([(hosts[a], hosts[b]) for a, b in pairs], probe, PAIR_ALLREDUCE_PORT + index % 100)
    result, suspects = evaluate_links(names, links, ctx.options.link_fraction)
    ctx.deep["links"] = [{"a": link.a, "b": link.b, "gbit_per_s": link.gbit_per_s, "allreduce_gbps": link.allreduce_gbps,
                          "note": link.note or link.allreduce_note} for link in links]
    ctx.suspects.update({name: why for name, why in suspects.items() if name not in ctx.suspects})
    if any(link.gbit_per_s is not None for link in links):
        plot_links(names, links, ctx.run_dir / "links.png")
    if any(link.allreduce_gbps is not None for link in links):
        plot_links(names, links, ctx.run_dir / "allreduce.png", allreduce=True)
    return result


DEEP_GATES = (
    Gate("gpu_health", "no GPU reports ECC, remapping, throttling, Xid or DCGM trouble", gate_gpu_health,
         stops_the_check=False, after_failure=True),
    Gate("compute", "every node's matrix multiply is near the others' median", gate_compute, stops_the_check=False,
         after_failure=True),
    Gate("links", "every pair of nodes' TCP and allreduce are near the others' median", gate_links, after_failure=True),
)
