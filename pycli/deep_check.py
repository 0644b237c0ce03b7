"""`pycli check --deep`: which node is slow and which link, by measurement.

Two gates after the usual ones, each comparing every figure with the median of the others
(so one sick node among three still stands out, and a whole slow cluster is no outlier):

- compute: every node at once runs a fixed float32 matrix multiply for a fixed time, on each
  of its GPUs or else on its CPU cores; a node's figure is its slowest device's GFLOP/s.
- links: every pair of nodes measures TCP with iperf3 both ways at once (a pair's figure is
  its slower direction), in rounds of disjoint pairs (the circle method: N-1 rounds of N/2
  pairs for N nodes, N rounds for odd N with one node idle each round), so each node carries
  one measurement at a time and the rounds grow linearly with N.

A node below `compute_fraction` of the others' median is named, and so is a pair below
`link_fraction` of the other pairs' median; a node all of whose links are named is itself a
suspect. `--fence` puts the suspects on the drained list (pycli/drained.py). The figures go
to `deep.json`, the pair matrix to `links.png` (a heat map), the compute figures to
`compute.png`.
"""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pycli.check import CheckContext, Gate, GateResult, failed, passed, skipped
from pycli.cluster_model import Host
from pycli.gpu_health import gate_gpu_health
from pycli.iperf import parse_iperf3, tcp_client_command, tcp_server_command, tcp_stop_command
from pycli.nodes import ssh_each

# Prints {"device": GFLOP/s, ...}: a float32 matmul repeated for SECONDS on every GPU, else the CPU.
_COMPUTE_PROBE = """
import json, sys, time, torch
seconds = float(sys.argv[1])
def rate(device):
    n = 2048 if device.type == "cuda" else 256
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            a @ b
        sync()
        count += 8
    return 2 * n ** 3 * count / (time.perf_counter() - start) / 1e9
devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] or [torch.device("cpu")]
print(json.dumps({str(d): rate(d) for d in devices}))
"""


def compute_command(python: str, seconds: float) -> str:
    return shlex.join([python, "-c", _COMPUTE_PROBE, str(seconds)])


def parse_compute(stdout: str) -> dict[str, float]:
    """The probe's figures per device; ValueError when its last line is not them."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the compute probe printed nothing")
    data = json.loads(lines[-1])
    if not isinstance(data, dict) or not data or not all(isinstance(v, (int, float)) for v in data.values()):
        raise ValueError(f"not the compute probe's figures: {lines[-1][:100]}")
    return {str(k): float(v) for k, v in data.items()}


def ratios_to_others(values: Mapping[str, float]) -> dict[str, float]:
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


def evaluate_compute(figures: Mapping[str, float], failures: Mapping[str, str], fraction: float) -> tuple[GateResult, dict[str, str]]:
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
    from pycli.train import layout_of

    hosts = ctx.cluster.hosts
    command = compute_command(layout_of(ctx.cluster).python, ctx.options.compute_seconds)
    # Nodes that share a machine's cores measure one at a time; separate machines all at once.
    batches = [[h] for h in hosts] if ctx.cluster.nodes_share_cpus else [list(hosts)]
    answers = {}
    for batch in batches:
        answers.update(ssh_each([(h, command) for h in batch], timeout_s=120 + 4 * ctx.options.compute_seconds))
    figures, failures, devices = {}, {}, {}
    for host in hosts:
        answer = answers[host.name]
        try:
            if not answer.ok:
                raise ValueError(answer.why())
            devices[host.name] = parse_compute(answer.stdout)
            figures[host.name] = min(devices[host.name].values())
        except ValueError as exc:
            failures[host.name] = str(exc)
    result, suspects = evaluate_compute(figures, failures, ctx.options.compute_fraction)
    if ctx.cluster.nodes_share_cpus and result.figure:
        result = replace(result, figure=f"{result.figure} (one node at a time: they share this machine's cores)")
    ctx.deep["compute"] = {"gflops": figures, "devices": devices, "ratios": ratios_to_others(figures)}
    ctx.suspects.update(suspects)
    if figures:
        plot_compute(figures, set(suspects), ctx.run_dir / "compute.png")
    return result


# --- links ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    gbit_per_s: float | None
    note: str = ""


def measure_round(pairs: Sequence[tuple[Host, Host]], seconds: int) -> list[Link]:
    """iperf3 over every pair of a round at once: a one-shot server on the second, the client on the first."""
    started = ssh_each([(server, tcp_server_command()) for _, server in pairs])
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
    """The links gate from every pair's figure; the suspects: nodes all of whose links are slow."""
    broken = [link for link in links if link.gbit_per_s is None]
    if broken:
        return failed("links", "; ".join(f"{l.a} <-> {l.b}: {l.note}" for l in broken)), {}
    speeds = {(l.a, l.b): float(l.gbit_per_s or 0) for l in links}
    shown = f"{len(links)} pair(s), {min(speeds.values(), default=0):.2f} to {max(speeds.values(), default=0):.2f} Gbit/s"
    if len(names) < 3:
        return passed("links", f"{shown} (fewer than 3 nodes: no other pair to compare with)"), {}
    ratios = ratios_to_others(speeds)
    slow = {pair: ratio for pair, ratio in ratios.items() if ratio < fraction}
    if not slow:
        return passed("links", f"{shown}; every pair at least {fraction:g} of the others' median"), {}
    suspects = {}
    for name in names:
        mine = [pair for pair in speeds if name in pair]
        if mine and all(pair in slow for pair in mine):
            suspects[name] = f"every link at most {max(slow[p] for p in mine):.0%} of the median link"
    said = "; ".join(f"{a} <-> {b}: {ratio:.0%} of the median link" for (a, b), ratio in slow.items())
    through = f"; every slow pair goes through {', '.join(suspects)}" if suspects else ""
    return failed("links", f"{said}{through}; look at the cable, the port and its speed, or drain the node", shown), suspects


def gate_links(ctx: CheckContext) -> GateResult:
    hosts = {h.name: h for h in ctx.cluster.hosts}
    names = list(hosts)
    if len(names) < 2:
        return skipped("links", "one node: no link to measure")
    links = []
    rounds = pair_rounds(names)
    if ctx.cluster.nodes_share_cpus:  # iperf3 is CPU-bound: pairs sharing cores would slow each other
        rounds = [[pair] for pairs in rounds for pair in pairs]
    for pairs in rounds:
        links += measure_round([(hosts[a], hosts[b]) for a, b in pairs], ctx.options.link_seconds)
    result, suspects = evaluate_links(names, links, ctx.options.link_fraction)
    ctx.deep["links"] = [{"a": l.a, "b": l.b, "gbit_per_s": l.gbit_per_s, "note": l.note} for l in links]
    ctx.suspects.update({name: why for name, why in suspects.items() if name not in ctx.suspects})
    if any(l.gbit_per_s is not None for l in links):
        plot_links(names, links, ctx.run_dir / "links.png")
    return result


# --- pictures ---------------------------------------------------------------------------------


def plot_links(names: Sequence[str], links: Sequence[Link], path: Path) -> None:
    """The pair matrix as a heat map, Gbit/s written in each cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    index = {name: i for i, name in enumerate(names)}
    grid = [[float("nan")] * len(names) for _ in names]
    for link in links:
        if link.gbit_per_s is not None:
            grid[index[link.a]][index[link.b]] = grid[index[link.b]][index[link.a]] = link.gbit_per_s
    size = max(4.0, 0.5 * len(names) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(grid, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=90 if len(names) > 8 else 0)
    ax.set_yticks(range(len(names)), names)
    measured = [link.gbit_per_s for link in links if link.gbit_per_s is not None]
    middle = (min(measured) + max(measured)) / 2
    if len(names) <= 24:
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if value == value:  # not NaN; dark text on the bright (fast) cells
                    ax.text(j, i, f"{value:.1f}", ha="center", va="center", color="black" if value > middle else "white",
                            fontsize=8)
    fig.colorbar(image, ax=ax, label="Gbit/s (iperf3)")
    ax.set_title("TCP between every pair of nodes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_compute(figures: Mapping[str, float], slow: set[str], path: Path) -> None:
    """The compute figure of every node as bars, the slow ones red, the median drawn across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(figures)
    median = statistics.median(figures.values())
    fig, ax = plt.subplots(figsize=(max(4.0, 0.4 * len(names) + 2), 3.5))
    ax.bar(names, [figures[n] for n in names], color=["tab:red" if n in slow else "tab:blue" for n in names])
    ax.axhline(median, color="gray", linestyle="--", label="median")
    ax.set_ylabel("GFLOP/s (slowest device)")
    ax.set_title("Compute per node")
    ax.tick_params(axis="x", rotation=90 if len(names) > 8 else 0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


DEEP_GATES = (
    Gate("gpu_health", "no GPU reports ECC, remapping, throttling, Xid or DCGM trouble", gate_gpu_health, stops_the_check=False),
    Gate("compute", "every node's matrix multiply is near the others' median", gate_compute, stops_the_check=False),
    Gate("links", "every pair of nodes' TCP is near the others' median", gate_links),
)
