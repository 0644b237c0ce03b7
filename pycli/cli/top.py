"""`pycli top`: the cluster live, a row per node and a line per GPU, until Ctrl-C."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from pycli.cli.options import INVENTORY_ARGUMENT, INVENTORY_OPTION, JSON_OPTION
from pycli.top.frame import ANSWER_S, AUTO, REFRESH_S, SOURCES


def top_cmd(
    inventory: Path | None = INVENTORY_ARGUMENT,
    inventory_option: Path | None = INVENTORY_OPTION,
    once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
    as_json: bool = JSON_OPTION,
    interval: float = typer.Option(REFRESH_S, "--interval", help="Seconds between refreshes."),
    source: str = typer.Option(
        AUTO, "--source", help=f"Where figures come from: {', '.join(SOURCES)} (auto: Prometheus where the inventory "
        "has a monitoring host, else SSH)."
    ),
    timeout: float = typer.Option(
        ANSWER_S, "--timeout", help="Seconds a node (or Prometheus) has to answer; past it, shown down."
    ),
) -> None:
    """Watch the cluster: CPU, memory, network, every GPU (use, memory, temperature, power, Xid/ECC),
    drained or not, and the jobs on each node. --json prints one frame for scripts."""
    from rich.console import Console
    from rich.live import Live

    from pycli.cli.options import load_inventory
    from pycli.core.errors import BadInput
    from pycli.core.json_documents import TOP, versioned
    from pycli.top.frame import TopRequest, take_frame
    from pycli.top.view import render

    cluster = load_inventory(inventory, inventory_option)
    request = TopRequest(source=source, timeout_s=timeout)
    request.check(cluster)
    if not 0.5 <= interval <= 3600:
        raise BadInput(f"--interval {interval:g}: give seconds from 0.5 to 3600")
    name = str(cluster.inventory or "")
    if as_json:
        print(json.dumps(versioned(TOP, take_frame(cluster, request).as_json()), indent=2))
        return
    console = Console()
    if once or not console.is_terminal:
        # Without a terminal (a pipe, a log) each frame is printed whole, one after another.
        wide = Console(width=max(console.width, 160)) if not console.is_terminal else console
        try:
            while True:
                frame = take_frame(cluster, request)
                wide.print(render(frame, name, height=10_000))
                if once:
                    return
                time.sleep(max(0.0, interval - frame.taken_s))
        except KeyboardInterrupt:
            return
    try:
        with Live(console=console, auto_refresh=False, screen=True) as live:
            while True:
                frame = take_frame(cluster, request)
                live.update(render(frame, name, console.height), refresh=True)
                time.sleep(max(0.0, interval - frame.taken_s))
    except KeyboardInterrupt:
        return  # Ctrl-C is how the view ends: the terminal is given back, exit 0
