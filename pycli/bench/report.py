"""The files of a `pycli bench` run, all made from its results document (see pycli.bench.run).

results.json (the document itself), results.csv (one row per combination, skipped ones
with their reason), runs.csv (one row per run), allreduce.csv (one row per backend and
message size), report.md (the environment table and the two speed-up tables of the backend-by-scale lab, the
allreduce table beside raw TCP) and PNG plots: throughput and scaling efficiency against
processes, each with its ideal line, and allreduce bus bandwidth against message size.
Everything here is a pure function of the document except the writing of the files.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pycli.core.json_documents import RESULTS
from pycli.core.sizes import human_size

if TYPE_CHECKING:  # matplotlib is imported where a plot is drawn (_pyplot)
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CELL_COLUMNS = (
    "launcher", "backend", "device", "scope", "servers", "processes_per_server", "processes", "status", "reason",
    "runs", "runs_ok", "step_time_ms", "step_time_ms_ci95", "throughput", "throughput_ci95", "speedup",
    "speedup_ci95", "efficiency", "efficiency_ci95", "spread_from", "peak_memory_mb", "final_loss", "val_accuracy",
)
RUN_COLUMNS = (
    "launcher", "backend", "device", "servers", "processes_per_server", "processes", "repeat", "exit_code", "seconds",
    "step_time_ms", "throughput", "peak_memory_mb", "final_loss", "val_accuracy", "error", "run_dir",
)
ALLREDUCE_COLUMNS = (
    "launcher", "backend", "device", "servers", "processes_per_server", "processes", "status", "reason", "bytes",
    "time_s", "time_s_ci95", "algbw_gbps", "algbw_gbps_ci95", "busbw_gbps", "busbw_gbps_ci95", "correct",
)
DASH = "—"


# --- numbers -------------------------------------------------------------------------------


def decimals_for(value: float) -> int:
    """Three significant digits, but never more than four decimals nor fewer than none."""
    if value == 0 or not math.isfinite(value):
        return 2
    return max(0, min(4, 2 - math.floor(math.log10(abs(value)))))


def format_value(value: float | None, ci95: float | None = None) -> str:
    """'12.3 ± 0.4', '12.3' (no spread known) or '—' (no value)."""
    if value is None:
        return DASH
    places = decimals_for(value)
    text = f"{value:.{places}f}"
    return f"{text} ± {ci95:.{places}f}" if ci95 is not None else text


# --- CSV and JSON --------------------------------------------------------------------------


def _csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row.get(key) for key in columns})
    return path


def run_rows(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [run for cell in document["cells"] for run in cell.get("repeats", [])]


def allreduce_rows(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for entry in document["allreduce"]:
        common = {key: entry.get(key) for key in ALLREDUCE_COLUMNS if key in entry}
        rows += [{**common, **size} for size in entry["sizes"]] or [common]
    return rows


# --- Markdown ------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _same_or_each(nodes: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], str]) -> str:
    """One value when every node agrees, else each node's (so a difference shows)."""
    values = [value(node) or "not installed" for node in nodes]
    if len(set(values)) == 1:
        return values[0]
    return "DIFFERS: " + "; ".join(f"{node['host']}: {text}" for node, text in zip(nodes, values, strict=True))


def _nic(node: Mapping[str, Any]) -> str:
    parts = [node.get("nic_interface") or "?"]
    if node.get("nic_driver"):
        parts.append(f"driver {node['nic_driver']}")
    if node.get("nic_speed_mbps"):
        parts.append(f"{node['nic_speed_mbps']} Mb/s")
    if node.get("nic_mtu"):
        parts.append(f"MTU {node['nic_mtu']}")
    return ", ".join(parts)


def _gpus(node: Mapping[str, Any]) -> str:
    if node.get("gpus"):
        names = sorted(set(node["gpus"]))
        return f"{len(node['gpus'])}x {', '.join(names)}"
    if node.get("gpu_pci"):
        why = node.get("nvidia_smi_error") or "missing"
        return f"{len(node['gpu_pci'])} NVIDIA device(s) on PCI, not usable (nvidia-smi: {why})"
    return "none"


def _gpu_link(node: Mapping[str, Any]) -> str:
    if not node.get("gpus"):
        return "none"
    return f"NVLink ({node['nvlink_links']} links up)" if node.get("nvlink_links") else "PCIe (no NVLink up)"


def _with_torch(own: str, torch_built: str) -> str:
    if not own and not torch_built:
        return ""
    return f"{own or 'not installed'}; torch built with {torch_built}" if torch_built else own


def environment_rows(nodes: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The environment table: one column per node, every row read from the nodes."""
    rows = [
        ("Servers", f"{len(nodes)} ({', '.join(node['host'] for node in nodes)})"),
        ("NIC (training network)", _same_or_each(nodes, _nic)),
        ("CPU", _same_or_each(nodes, lambda n: f"{n.get('cpu_model') or '?'}, {n.get('cpus')} cores, "
                                                 f"{(n.get('memory_mb') or 0) / 1024:.0f} GiB")),
        ("GPU", _same_or_each(nodes, _gpus)),
        ("GPU interconnect", _same_or_each(nodes, _gpu_link)),
        ("OS", _same_or_each(nodes, lambda n: n.get("os", ""))),
        ("Kernel", _same_or_each(nodes, lambda n: n.get("kernel", ""))),
        ("GPU driver", _same_or_each(nodes, lambda n: n.get("driver") or ("none" if not n.get("gpu_pci") else ""))),
        ("CUDA", _same_or_each(nodes, lambda n: _with_torch(n.get("cuda", ""), n.get("torch_cuda", "")) or "none")),
        ("NCCL", _same_or_each(nodes, lambda n: _with_torch(n.get("nccl", ""), n.get("torch_nccl", "")) or "none")),
        ("Python", _same_or_each(nodes, lambda n: n.get("python", ""))),
        ("torch", _same_or_each(nodes, lambda n: n.get("torch", ""))),
        ("Horovod", _same_or_each(nodes, lambda n: f"{n['horovod']} ({n['horovod_build']})" if n.get("horovod") else "")),
        ("Open MPI", _same_or_each(nodes, lambda n: n.get("openmpi", ""))),
        ("iperf3", _same_or_each(nodes, lambda n: n.get("iperf3", ""))),
    ]
    return rows


SCALING_HEADER = (
    "Backend", "Launcher", "Device", "Servers", "Processes per server", "Mean step time (ms)", "Throughput ({unit})",
    "Speed-up", "Efficiency", "Peak memory per rank (MiB)", "Final loss", "Runs ok",
)


def scaling_rows(cells: Iterable[Mapping[str, Any]], scope: str) -> list[list[str]]:
    rows = []
    for cell in cells:
        # The 1-process run is the baseline of both tables.
        if cell["status"] == "skipped" or not (cell["scope"] == scope or cell["processes"] == 1):
            continue
        rows.append([
            cell["backend"].upper() if cell["backend"] != "gloo" else "Gloo", cell["launcher"], cell["device"],
            str(cell["servers"]), str(cell["processes_per_server"]),
            format_value(cell["step_time_ms"], cell["step_time_ms_ci95"]),
            format_value(cell["throughput"], cell["throughput_ci95"]),
            format_value(cell["speedup"], cell["speedup_ci95"]),
            format_value(cell["efficiency"], cell["efficiency_ci95"]),
            format_value(cell["peak_memory_mb"]), format_value(cell["final_loss"]),
            f"{cell['runs_ok']}/{cell['runs']}",
        ])
    return rows


def allreduce_section(document: Mapping[str, Any]) -> str:
    measured = [entry for entry in document["allreduce"] if entry["sizes"]]
    tcp = document.get("tcp")
    lines = ["## Allreduce bandwidth", ""]
    if not measured:
        lines.append("No allreduce microbenchmark ran" + (" (--no-allreduce)." if not document["allreduce"] else "; see below."))
        return "\n".join(lines)
    first = measured[0]
    lines.append(
        f"workloads/allreduce.py, float32 sum on {first['processes']} process(es) ({first['servers']} server(s) x "
        f"{first['processes_per_server']}); mean of the timed iterations ± 1.96 σ. algbw = bytes / time; "
        "busbw = algbw · 2(n−1)/n (nccl-tests), the rate each link carries, comparable with the raw TCP rate below."
    )
    lines.append("")
    sizes = sorted({size["bytes"] for entry in measured for size in entry["sizes"]})
    header = ["Size"]
    for entry in measured:
        label = f"{entry['backend']} ({entry['launcher']})"
        header += [f"{label} algbw GB/s", f"{label} busbw GB/s"]
    rows = []
    for size in sizes:
        row = [human_size(size)]
        for entry in measured:
            record = next((r for r in entry["sizes"] if r["bytes"] == size), None)
            row += [format_value(record["algbw_gbps"], record["algbw_gbps_ci95"]) if record else DASH,
                    format_value(record["busbw_gbps"], record["busbw_gbps_ci95"]) if record else DASH]
        rows.append(row)
    lines += [_table(header, rows), ""]
    if tcp and tcp.get("gbit_per_s"):
        wire = tcp["gbit_per_s"] / 8
        lines.append(f"Raw TCP {tcp['client']} → {tcp['server']}: {tcp['gbit_per_s']:.2f} Gbit/s = {wire:.3f} GB/s "
                     f"(iperf3, one stream, {tcp['seconds']} s).")
        shares = []
        for entry in measured:
            largest = max(entry["sizes"], key=lambda r: r["bytes"])
            shares.append(f"{entry['backend']} ({entry['launcher']}) {100 * largest['busbw_gbps'] / wire:.0f} %")
        lines.append(f"busbw at the largest size as a share of the wire: {', '.join(shares)}.")
    elif tcp:
        lines.append(f"Raw TCP: {tcp['note']}.")
    else:
        lines.append("Raw TCP was not measured (the run was interrupted first).")
    return "\n".join(lines)


def skipped_lines(document: Mapping[str, Any]) -> list[str]:
    """One line per reason a backend and launcher were skipped, naming the placements (servers x processes)."""
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for kind, entries in (("", document["cells"]), ("allreduce microbenchmark: ", document["allreduce"])):
        for entry in entries:
            if entry["status"] == "skipped":
                key = (kind, entry["backend"], entry["launcher"], entry["reason"])
                groups.setdefault(key, []).append(f"{entry['servers']}x{entry['processes_per_server']}")
    return [f"{kind}{backend} via {launcher} ({', '.join(places)} servers x processes): {reason}"
            for (kind, backend, launcher, reason), places in groups.items()]


def render_markdown(document: Mapping[str, Any], plots: Sequence[str]) -> str:
    unit = document["throughput_unit"]
    header = [column.format(unit=unit) for column in SCALING_HEADER]
    cells = document["cells"]
    parts = [
        f"# pycli bench: {document['workload']} on {len(document['environment'])} server(s)",
        "",
        f"Started {document['started']}, took {document['seconds']:.0f} s; {document['repeat']} run(s) per combination. "
        f"Made with `{document['command']}`.",
        "Each figure is the mean ± 1.96 σ over the runs (a 95 % interval); with one run, the spread of that run's own "
        "iterations where the workload reports one. Speed-up is against the 1-process run of the same backend and "
        "launcher; efficiency = speed-up / processes (1 is perfect scaling). How to read it: docs/bench.md.",
    ]
    if document.get("interrupted"):
        parts += ["", "**Interrupted: only the runs that finished are here.**"]
    parts += ["", "## Environment", "", _table(["Item", "Value"], environment_rows(document["environment"]))]
    for scope in ("within one server", "across servers"):
        rows = scaling_rows(cells, scope)
        parts += ["", f"## Speed-up {scope}", "", _table(header, rows) if rows else "Nothing was run here."]
    parts += ["", allreduce_section(document)]
    if plots:
        parts += ["", "## Plots", ""] + [f"![{Path(plot).stem}]({plot})" for plot in plots]
    skipped = skipped_lines(document)
    if skipped:
        parts += ["", "## Skipped", ""] + [f"- {line}" for line in skipped]
    failed = [run for run in run_rows(document) if run["throughput"] is None]
    failed_allreduce = [a for a in document["allreduce"] if a["status"] == "failed"]
    if failed or failed_allreduce:
        parts += ["", "## Failed runs", ""]
        parts += [f"- {run['backend']} via {run['launcher']}, {run['servers']}x{run['processes_per_server']}, run "
                  f"{run['repeat']}: {run['error'] or 'no metrics'} (`{run['run_dir']}/output.log`)" for run in failed]
        parts += [f"- allreduce {a['backend']} via {a['launcher']}: {a['reason'] or 'no results'} (`{a['run_dir']}/output.log`)"
                  for a in failed_allreduce]
    return "\n".join(parts) + "\n"


# --- plots ---------------------------------------------------------------------------------


def scaling_series(cells: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Measured cells per line of the plot: launcher, backend and scope; the 1-process run starts both scopes."""
    measured = [cell for cell in cells if cell["status"] != "skipped" and cell.get("throughput") is not None]
    series: dict[str, list[Mapping[str, Any]]] = {}
    for cell in measured:
        scopes = ("within one server", "across servers") if cell["processes"] == 1 else (cell["scope"],)
        for scope in scopes:
            series.setdefault(f"{cell['backend']} ({cell['launcher']}), {scope}", []).append(cell)
    return {label: sorted(points, key=lambda c: c["processes"]) for label, points in series.items() if len(points) > 0}


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(plt: ModuleType, figure: Figure, axes: Axes, path: Path) -> None:
    """The finish every plot shares: grid, legend, tight layout, a PNG, the figure closed."""
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_scaling(document: Mapping[str, Any], throughput_path: Path, efficiency_path: Path) -> list[Path]:
    series = scaling_series(document["cells"])
    if not series:
        return []
    plt = _pyplot()
    unit = document["throughput_unit"]
    most = max(cell["processes"] for points in series.values() for cell in points)
    ticks = sorted({cell["processes"] for points in series.values() for cell in points})

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, (label, points) in enumerate(series.items()):
        color = f"C{index % 10}"
        x = [p["processes"] for p in points]
        axes.errorbar(x, [p["throughput"] for p in points], yerr=[p["throughput_ci95"] or 0 for p in points],
                      marker="o", capsize=3, color=color, label=label,
                      linestyle="-" if "within" in label else "--")
        base = next((p for p in points if p["processes"] == 1), None)
        if base is not None:
            axes.plot([1, most], [base["throughput"], base["throughput"] * most], color=color, linestyle=":", linewidth=1)
    axes.plot([], [], color="gray", linestyle=":", label="ideal (1-process rate x processes)")
    axes.set_xlabel("processes")
    axes.set_ylabel(f"throughput ({unit})")
    axes.set_xticks(ticks)
    axes.set_title(f"{document['workload']}: throughput (mean ± 95 % interval)")
    _save(plt, figure, axes, throughput_path)

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, (label, points) in enumerate(series.items()):
        efficiency = [p["efficiency"] if p["efficiency"] is not None else math.nan for p in points]
        axes.errorbar([p["processes"] for p in points], efficiency,
                      yerr=[p["efficiency_ci95"] or 0 for p in points], marker="o", capsize=3, color=f"C{index % 10}",
                      label=label, linestyle="-" if "within" in label else "--")
    axes.axhline(1.0, color="black", linestyle=":", linewidth=1, label="ideal (perfect scaling)")
    axes.set_xlabel("processes")
    axes.set_ylabel("scaling efficiency (speed-up / processes)")
    axes.set_xticks(ticks)
    axes.set_ylim(bottom=0)
    axes.set_title(f"{document['workload']}: scaling efficiency (mean ± 95 % interval)")
    _save(plt, figure, axes, efficiency_path)
    return [throughput_path, efficiency_path]


def plot_allreduce(document: Mapping[str, Any], path: Path) -> list[Path]:
    measured = [entry for entry in document["allreduce"] if entry["sizes"]]
    if not measured:
        return []
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, entry in enumerate(measured):
        sizes = sorted(entry["sizes"], key=lambda r: r["bytes"])
        axes.errorbar([r["bytes"] for r in sizes], [r["busbw_gbps"] for r in sizes],
                      yerr=[r["busbw_gbps_ci95"] for r in sizes], marker="o", capsize=3, color=f"C{index % 10}",
                      label=f"{entry['backend']} ({entry['launcher']}) busbw")
    tcp = document.get("tcp")
    if tcp and tcp.get("gbit_per_s"):
        axes.axhline(tcp["gbit_per_s"] / 8, color="black", linestyle=":", label="raw TCP (iperf3)")
    axes.set_xscale("log", base=2)
    sizes = sorted({r["bytes"] for entry in measured for r in entry["sizes"]})
    axes.set_xticks(sizes[:: max(1, len(sizes) // 8)], [human_size(s) for s in sizes[:: max(1, len(sizes) // 8)]])
    axes.set_xlabel("message size")
    axes.set_ylim(bottom=0)
    axes.set_ylabel("bus bandwidth (GB/s)")
    axes.set_title("allreduce bus bandwidth (mean ± 95 % interval)")
    _save(plt, figure, axes, path)
    return [path]


# --- all files -----------------------------------------------------------------------------


def write_report(document: Mapping[str, Any], run_dir: Path) -> list[Path]:
    """Every file of the report into run_dir; returns their paths, report.md first."""
    run_dir.mkdir(parents=True, exist_ok=True)
    plots = plot_scaling(document, run_dir / "throughput.png", run_dir / "efficiency.png")
    plots += plot_allreduce(document, run_dir / "allreduce.png")
    report = run_dir / "report.md"
    report.write_text(render_markdown(document, [plot.name for plot in plots]))
    results = run_dir / RESULTS.file_name
    results.write_text(json.dumps(document, indent=2) + "\n")
    cells = [{key: value for key, value in cell.items() if key != "repeats"} for cell in document["cells"]]
    tables = [
        _csv(run_dir / "results.csv", CELL_COLUMNS, cells),
        _csv(run_dir / "runs.csv", RUN_COLUMNS, run_rows(document)),
    ]
    if document["allreduce"]:
        tables.append(_csv(run_dir / "allreduce.csv", ALLREDUCE_COLUMNS, allreduce_rows(document)))
    return [report, results, *tables, *plots]
