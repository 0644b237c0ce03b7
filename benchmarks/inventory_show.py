"""How fast `pycli inventory show` reads a large inventory; the goal is under 2 s for 1,000 hosts.

Prints figures, asserts nothing: a timed test would fail on a loaded CI machine for no reason.
Run: .venv/bin/python benchmarks/inventory_show.py [--hosts 1000] [--repeat 3]

Cases: a flat INI file; a directory with group_vars/ and a host_vars/ file for every host.
For each: the whole command in a fresh process (what a user waits for, Python and Ansible
start-up included), load_cluster() alone, and for comparison Ansible's
VariableManager.get_vars() per host, which pycli's loader avoids.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pycli.cluster.inventory_writer import HostEntry, render_inventory  # noqa: E402
from pycli.cluster.model import load_cluster  # noqa: E402

GOAL_S = 2.0


def flat_ini(folder: Path, count: int) -> Path:
    hosts = [HostEntry(name=f"gpu{i:04d}", address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", slots=8) for i in range(count)]
    path = folder / "flat.ini"
    path.write_text(render_inventory(hosts, group_vars={"ansible_user": "train", "slots": 4}, launcher="gpu0000"))
    return path


def directory_with_vars(folder: Path, count: int) -> Path:
    inventory = folder / "bydir"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "host_vars").mkdir()
    (inventory / "group_vars" / "all.yml").write_text("ansible_user: train\n")
    (inventory / "group_vars" / "nodes.yml").write_text("slots: 4\nansible_port: 22\n")
    lines = ["nodes:", "  hosts:"] + [f"    gpu{i:04d}:" for i in range(count)]
    (inventory / "hosts.yml").write_text("\n".join(lines) + "\n")
    for i in range(count):
        (inventory / "host_vars" / f"gpu{i:04d}.yml").write_text(f"ansible_host: 10.1.{i // 256}.{i % 256}\nslots: 8\n")
    return inventory


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children: unlike wall time, not inflated
    when other work shares the machine."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(action: Callable[[], object], repeat: int) -> tuple[float, float, float]:
    """Best and median wall seconds, and median CPU seconds, over `repeat` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), _cpu_seconds()
        action()
        walls.append(time.perf_counter() - wall)
        cpus.append(_cpu_seconds() - cpu)
    return min(walls), statistics.median(walls), statistics.median(cpus)


def run_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pycli", *args], check=True, capture_output=True, cwd=ROOT)


def variable_manager_per_host(path: Path) -> None:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=inventory)
    for host in inventory.groups["nodes"].get_hosts():
        variables.get_vars(host=host)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    load = ", ".join(f"{figure:.1f}" for figure in os.getloadavg())
    print(f"{args.hosts} hosts, {args.repeat} runs each, goal for the command: < {GOAL_S} s wall")
    print(f"{os.cpu_count()} CPUs, load average {load} (wall times grow with load; CPU times do not)\n")
    print(f"{'case':<44} {'best s':>7} {'median s':>9} {'CPU s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = {
            "flat INI": flat_ini(folder, args.hosts),
            "dir + group_vars + host_vars": directory_with_vars(folder, args.hosts),
        }
        for label, inventory in cases.items():
            cluster = load_cluster(inventory)
            assert len(cluster.hosts) == args.hosts and cluster.total_slots == 8 * args.hosts
            rows = [
                ("pycli inventory show (table, new process)", lambda: run_cli("inventory", "show", str(inventory))),
                ("pycli inventory show --json (new process)", lambda: run_cli("inventory", "show", "--json", str(inventory))),
                ("load_cluster() in process", lambda: load_cluster(inventory)),
                ("ansible VariableManager.get_vars per host", lambda: variable_manager_per_host(inventory)),
            ]
            print(f"-- {label}")
            for name, action in rows:
                best, median, cpu = measure(action, args.repeat)
                mark = "  (over the goal)" if name.startswith("pycli") and best >= GOAL_S else ""
                print(f"   {name:<41} {best:>7.2f} {median:>9.2f} {cpu:>7.2f}{mark}")


if __name__ == "__main__":
    main()
