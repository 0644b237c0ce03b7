"""How `pycli top` draws a frame: a header (source, states, notes), then a row per node and a
line per GPU; past a screenful, a row per node alone, worst first, and one line for the rest
(as the provisioning view summarises a large cluster).
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from pycli.top.model import Frame, GpuSample, NodeView

# Lines the header and the table's own frame take besides the rows.
HEADER_LINES = 6


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def _memory(used: float | None, total: float | None) -> str:
    return "-" if used is None or total is None else f"{_bytes(used)}/{_bytes(total)}"


def _rate(rx: float | None, tx: float | None) -> str:
    return "-" if rx is None or tx is None else f"{_bytes(rx)}/s {_bytes(tx)}/s"


def _state(node: NodeView) -> Text:
    if not node.sample.up:
        return Text(f"down: {node.sample.why}", style="bold red")
    words = node.state
    if node.drained:
        words += f" ({node.drained})"
    elif node.slurm_reason:
        words += f" ({node.slurm_reason})"
    return Text(words, style="yellow" if node.severity else "green")


def _gpu_cells(gpu: GpuSample) -> list[str | Text]:
    mem = "-" if gpu.mem_used_mib is None or gpu.mem_total_mib is None else \
        f"{gpu.mem_used_mib / 1024:.1f}/{gpu.mem_total_mib / 1024:.0f}G"
    power = "-" if gpu.power_w is None else f"{gpu.power_w:.0f}" + (f"/{gpu.power_limit_w:.0f}W" if gpu.power_limit_w else "W")
    temp = "-" if gpu.temp_c is None else f"{gpu.temp_c:.0f}C"
    xid = "-" if gpu.last_xid is None else (str(gpu.last_xid) if gpu.last_xid else "0")
    if gpu.xid_count:
        xid += f" x{gpu.xid_count}"
    ecc = "-" if gpu.ecc_uncorrected is None else str(gpu.ecc_uncorrected)
    faults = Text(f"{xid}/{ecc}", style="bold red" if gpu.problem else "")
    return [f"{gpu.index} {gpu.name}".strip(), _pct(gpu.util_pct), mem, Text(temp, style="red" if gpu.problem else ""),
            power, faults, ",".join(gpu.jobs)]


COLUMNS = ("node", "state", "cpu", "mem", "net in/out", "gpu", "util", "gpu mem", "temp", "power", "xid/ecc", "jobs")


def header(frame: Frame, cluster_name: str) -> Text:
    counts = ", ".join(f"{count} {state}" for state, count in sorted(frame.counts().items()))
    text = Text(f"pycli top  {cluster_name}  {frame.at}  {len(frame.nodes)} nodes: {counts}\n")
    text.append(f"source: {frame.source_line} (read in {frame.taken_s:.1f} s)")
    for note in frame.notes:
        text.append(f"\n{note}", style="yellow")
    return text


def table(frame: Frame, max_rows: int) -> Table:
    """A row per node and a line per GPU, in inventory order; past `max_rows` lines, summary()."""
    lines = sum(1 + len(node.sample.gpus) for node in frame.nodes)
    if lines > max_rows:
        return summary(frame, max_rows)
    grid = Table(*COLUMNS, box=None, pad_edge=False, header_style="bold")
    for node in frame.nodes:
        error = [Text(node.sample.gpu_error, style="bold red")] if node.sample.gpu_error else [""]
        grid.add_row(*_node_cells(node), *error, *([""] * 5), ",".join(node.jobs))
        for gpu in node.sample.gpus:
            grid.add_row("", "", "", "", "", *_gpu_cells(gpu))
    return grid


def _node_cells(node: NodeView) -> list[str | Text]:
    sample = node.sample
    if not sample.up:
        return [node.name, _state(node), "", "", ""]
    return [node.name, _state(node), _pct(sample.cpu_pct), _memory(sample.mem_used_bytes, sample.mem_total_bytes),
            _rate(sample.net_rx_bps, sample.net_tx_bps)]


def _gpus_in_brief(node: NodeView) -> list[str | Text]:
    gpus = node.sample.gpus
    if node.sample.gpu_error:
        return [Text(node.sample.gpu_error, style="bold red"), "", "", "", "", ""]
    if not gpus:
        return ["", "", "", "", "", ""]
    utils = [g.util_pct for g in gpus if g.util_pct is not None]
    temps = [g.temp_c for g in gpus if g.temp_c is not None]
    powers = [g.power_w for g in gpus if g.power_w is not None]
    troubled = [f"{g.index}: {g.problem}" for g in gpus if g.problem]
    return [f"{len(gpus)} GPUs", _pct(sum(utils) / len(utils)) if utils else "-", "",
            f"max {max(temps):.0f}C" if temps else "-", f"{sum(powers):.0f}W" if powers else "-",
            Text("; ".join(troubled), style="bold red") if troubled else ""]


def summary(frame: Frame, max_rows: int) -> Table:
    """One row per node, worst first (down, GPU trouble, drained, then the hottest and busiest),
    as many as fit; one more line counts the rest by state."""
    grid = Table(*COLUMNS, box=None, pad_edge=False, header_style="bold", title="worst first")
    ranked = frame.worst_first()
    shown = ranked[: max(1, max_rows - 1)] if len(ranked) > max_rows else ranked
    for node in shown:
        grid.add_row(*_node_cells(node), *_gpus_in_brief(node), ",".join(node.jobs))
    rest = ranked[len(shown):]
    if rest:
        counts: dict[str, int] = {}
        for node in rest:
            counts[node.state] = counts.get(node.state, 0) + 1
        grid.add_row(f"+{len(rest)} more", ", ".join(f"{count} {state}" for state, count in sorted(counts.items())))
    return grid


def render(frame: Frame, cluster_name: str, height: int) -> Group:
    return Group(header(frame, cluster_name), Text(""), table(frame, max(4, height - HEADER_LINES - len(frame.notes))))
