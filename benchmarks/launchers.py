#!/usr/bin/env python3
"""Horovod against torchrun on the same work, and what `pycli train` adds to a job, in one run
on one provisioned cluster:

    .venv/bin/python benchmarks/launchers.py -i inventory/local-local.ini [--repeat 2] [--json out.json]
                                             [--only bench|overhead]

1. `pycli bench --backends gloo --np 1,2 --launchers horovod,torchrun` (the synthetic workload):
   throughput per placement under each launcher, and the allreduce microbenchmark under each
   (Horovod's allreduce and torch.distributed's, both over Gloo) beside iperf3 between the nodes.
2. `pycli train mnist --np 2 -- --epochs 1`: first with the nodes' store emptied (everything is
   sent), then `--repeat` times with the files there, its wall time; then the very command line
   pycli ran (the launcher's line from the run's job.txt, threads per rank and all) run bare
   over ssh on the same node, with the job's files already there, as many times.

It prints three tables with the goals of issue 14 beside the figures (Horovod / torchrun >= 1.0
at every placement; Horovod's busbw >= torch.distributed's from 16 MB up; pycli's wall time
minus the bare command's <= 2 s when the job's files are on the nodes, the first run's <= 4 s).
Timing is all it does: it judges nothing and exits 0 when every run ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYCLI = ROOT / ".venv" / "bin" / "pycli"
sys.path.insert(0, str(ROOT))

from pycli.core.json_documents import RESULTS, read_document  # noqa: E402

GOAL_RATIO = 1.0
GOAL_BUSBW_FROM = 16 * 2**20
GOAL_OVERHEAD_S = {"files on the nodes": 2.0, "first run": 4.0}
TRAIN_ARGS = ("train", "mnist", "--np", "2")
WORKLOAD_ARGS = ("--", "--epochs", "1")


def run(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    began = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:6])} ... failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return seconds, done


def newest(runs: Path, kind: str) -> Path:
    folders = sorted(runs.glob(f"*-{kind}*"), key=lambda p: p.stat().st_mtime)
    if not folders:
        sys.exit(f"no {kind} run folder in {runs}")
    return folders[-1]


def bench(inventory: Path, repeat: int, env: dict[str, str], runs: Path) -> dict:
    run([str(PYCLI), "bench", "-i", str(inventory), "--backends", "gloo", "--np-list", "1,2",
         "--launchers", "horovod,torchrun", "--repeat", str(repeat), "--allreduce-sizes", "1M:256M"], env)
    return read_document(RESULTS, newest(runs, "bench") / "results.json")


def throughput_rows(results: dict) -> list[dict]:
    """Per placement: each launcher's throughput and Horovod / torchrun."""
    by_place: dict[tuple[int, int], dict[str, float]] = {}
    for cell in results["cells"]:
        if cell.get("status") == "ok" and cell.get("throughput"):
            by_place.setdefault((cell["servers"], cell["processes_per_server"]), {})[cell["launcher"]] = cell["throughput"]
    rows = []
    for (servers, per_server), got in sorted(by_place.items()):
        hvd, tr = got.get("horovod"), got.get("torchrun")
        rows.append({"placement": f"{servers} server(s) x {per_server} process(es)", "horovod": hvd, "torchrun": tr,
                     "ratio": hvd / tr if hvd and tr else None})
    return rows


def allreduce_rows(results: dict) -> tuple[list[dict], float | None]:
    """Per message size: each launcher's busbw (GB/s) and the share of iperf3's wire speed."""
    busbw: dict[int, dict[str, float]] = {}
    for entry in results["allreduce"]:
        for record in entry.get("sizes") or []:
            busbw.setdefault(record["bytes"], {})[entry["launcher"]] = record["busbw_gbps"]
    wire = (results.get("tcp") or {}).get("gbit_per_s")  # iperf3 between the nodes (pycli.cluster.iperf.TcpLink)
    wire_gbytes = wire / 8 if wire else None
    rows = []
    for size, got in sorted(busbw.items()):
        hvd, tr = got.get("horovod"), got.get("torchrun")
        rows.append({"bytes": size, "horovod": hvd, "torchrun": tr, "ratio": hvd / tr if hvd and tr else None,
                     "horovod_share": hvd / wire_gbytes if hvd and wire_gbytes else None,
                     "torchrun_share": tr / wire_gbytes if tr and wire_gbytes else None})
    return rows, wire


def overhead(inventory: Path, repeat: int, env: dict[str, str], runs: Path) -> dict:
    """`pycli train` wall times, then its launcher line run bare over ssh on the same node."""
    from pycli.cluster.model import load_cluster
    from pycli.cluster.nodes import ssh_argv
    from pycli.jobs.train import layout_of

    cluster = load_cluster(inventory)
    store = layout_of(cluster).store
    for host in cluster.hosts:  # the first run sends the workload and data again
        run(ssh_argv(host, f"rm -rf {store}"), env)
    trains = []
    for _ in range(repeat + 1):
        seconds, _ = run([str(PYCLI), *TRAIN_ARGS, "-i", str(inventory), *WORKLOAD_ARGS], env)
        trains.append(seconds)
    job = (newest(runs, "train") / "job.txt").read_text().splitlines()
    name, line = job[2].split(": ", 1)  # "node1: cd /srv/... && exec env ... horovodrun ..."
    host = next(h for h in cluster.hosts if h.name == name)
    bares = [run(ssh_argv(host, line), env)[0] for _ in range(repeat)]
    return {"train_first_s": trains[0], "train_s": trains[1:], "bare_s": bares, "command": line}


def f(value: float | None, form: str = ".1f") -> str:
    return "-" if value is None else format(value, form)


def show(rows: dict, wire: float | None, times: dict | None, unit: str) -> None:
    if rows["throughput"] or rows["allreduce"]:
        show_bench(rows, wire, unit)
    if times is not None:
        show_overhead(times)


def show_bench(rows: dict, wire: float | None, unit: str) -> None:
    print(f"\n## Throughput, synthetic workload over Gloo ({unit}); goal Horovod / torchrun >= {GOAL_RATIO}\n")
    print("| placement | Horovod | torchrun | Horovod / torchrun | goal |\n|---|---|---|---|---|")
    for row in rows["throughput"]:
        met = "-" if row["ratio"] is None else ("met" if row["ratio"] >= GOAL_RATIO else "NOT met")
        print(f"| {row['placement']} | {f(row['horovod'])} | {f(row['torchrun'])} | {f(row['ratio'], '.2f')} | {met} |")
    print(f"\n## Allreduce busbw, GB/s (share of iperf3's {f(wire, '.2f')} Gbit/s); goal Horovod >= torch.distributed from 16 MB\n")
    print("| size | Horovod | torch.distributed | Horovod / torch | Horovod's share | torch's share | goal |\n|---|---|---|---|---|---|---|")
    for row in rows["allreduce"]:
        met = "" if row["bytes"] < GOAL_BUSBW_FROM or row["ratio"] is None else ("met" if row["ratio"] >= 1.0 else "NOT met")
        share = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
        print(f"| {row['bytes'] / 2**20:g} MiB | {f(row['horovod'], '.3f')} | {f(row['torchrun'], '.3f')} | "
              f"{f(row['ratio'], '.2f')} | {share(row['horovod_share'])} | {share(row['torchrun_share'])} | {met} |")


def show_overhead(times: dict) -> None:
    bare = statistics.median(times["bare_s"])
    print("\n## `pycli train " + " ".join(TRAIN_ARGS[1:] + WORKLOAD_ARGS) + "`: wall time against the same command bare over ssh\n")
    print("| run | pycli train, s | bare, s (median) | pycli adds, s | goal |\n|---|---|---|---|---|")
    for label, seconds in (("first run", times["train_first_s"]), ("files on the nodes", statistics.median(times["train_s"]))):
        added = seconds - bare
        goal = GOAL_OVERHEAD_S[label]
        print(f"| {label} | {seconds:.1f} | {bare:.1f} | {added:.1f} | <= {goal:g} s: {'met' if added <= goal else 'NOT met'} |")
    print(f"\nEvery pycli train: {', '.join(f'{s:.1f}' for s in [times['train_first_s'], *times['train_s']])} s; "
          f"every bare run: {', '.join(f'{s:.1f}' for s in times['bare_s'])} s.\nThe bare command: {times['command']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="a provisioned cluster's inventory")
    parser.add_argument("--repeat", type=int, default=2, help="runs per bench cell, and timed train/bare runs")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--only", choices=("bench", "overhead"),
                        help="one part: the launchers' throughput and allreduce (1), or what pycli train adds (2)")
    args = parser.parse_args()
    if not args.inventory.is_file():
        sys.exit(f"no inventory at {args.inventory}")
    if args.repeat < 1:
        sys.exit("--repeat: at least 1")
    with tempfile.TemporaryDirectory(prefix="pycli-launchers-") as folder:
        runs = Path(folder)
        env = {**os.environ, "PYCLI_RUNS": str(runs)}
        started = time.strftime("%Y-%m-%d %H:%M")
        results: dict = {}
        rows: dict = {"throughput": [], "allreduce": []}
        wire, times = None, None
        if args.only != "overhead":
            results = bench(args.inventory, args.repeat, env, runs)
            allreduce, wire = allreduce_rows(results)
            rows = {"throughput": throughput_rows(results), "allreduce": allreduce}
        if args.only != "bench":
            times = overhead(args.inventory, args.repeat, env, runs)
    print(f"# Launchers, {started}, {args.inventory} ({args.repeat} repeat(s))")
    show(rows, wire, times, results.get("throughput_unit", "img/s"))
    if args.json:
        args.json.write_text(json.dumps({"started": started, **rows, "wire_gbit_per_s": wire, "overhead": times}, indent=2) + "\n")


if __name__ == "__main__":
    main()
