"""What the deep check measured between two nodes, apart from how it measures (pycli/health/deep.py)
and how it draws it (pycli/health/plots.py): both import it, neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One pair of nodes: its TCP and its two-rank allreduce, or why either is missing."""

    a: str
    b: str
    gbit_per_s: float | None  # TCP, iperf3 (None: not measured, `note` says why)
    note: str = ""
    allreduce_gbps: float | None = None  # the pair's allreduce busbw in GB/s
    allreduce_note: str = ""  # why there is no allreduce figure
