"""The deep check's pictures, written next to check.json: the pair matrices as heat maps
(`links.png` TCP, `allreduce.png`) and the compute figure of every node as bars (`compute.png`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from pycli.health.figures import Link


def plot_links(names: Sequence[str], links: Sequence[Link], path: Path, *, allreduce: bool = False) -> None:
    """The pair matrix as a heat map, the figure written in each cell: TCP Gbit/s, or allreduce GB/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    index = {name: i for i, name in enumerate(names)}
    grid = [[float("nan")] * len(names) for _ in names]
    figures = {(link.a, link.b): link.allreduce_gbps if allreduce else link.gbit_per_s for link in links}
    for (a, b), value in figures.items():
        if value is not None:
            grid[index[a]][index[b]] = grid[index[b]][index[a]] = value
    size = max(4.0, 0.5 * len(names) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(grid, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=90 if len(names) > 8 else 0)
    ax.set_yticks(range(len(names)), names)
    measured = [value for value in figures.values() if value is not None]
    middle = (min(measured) + max(measured)) / 2
    if len(names) <= 24:
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if value == value:  # not NaN; dark text on the bright (fast) cells
                    ax.text(j, i, f"{value:.3g}", ha="center", va="center", color="black" if value > middle else "white",
                            fontsize=8)
    fig.colorbar(image, ax=ax, label="GB/s busbw (two-rank allreduce)" if allreduce else "Gbit/s (iperf3)")
    ax.set_title("Allreduce between every pair of nodes" if allreduce else "TCP between every pair of nodes")
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
