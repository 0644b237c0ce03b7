#!/usr/bin/env python3
"""Provisioning cost against cluster size, on light local nodes.

    .venv/bin/python benchmarks/scale.py [--nodes 1,2,4,8,16] [--stages ssh_trust] [--artifact-mb 64]
        [--without-cache-at 8,32] [--slurm] [--monitoring] [--json figures.json]

For each N: a fresh local cluster of N nodes (`pycli cluster up --name scale --nodes N`), then
for each stage (a tag of playbooks/site.yml, docs/tags.md) a first run and a no-change run of
`pycli provision --tags STAGE`, then `pycli cluster down`; the stage `site` is the whole of
site.yml (no --tags: every role, the Open MPI and Horovod builds included where the controller
cache does not hold them yet; the Slurm and monitoring plays with --slurm and --monitoring, which
put node1 in their groups). Two more stages send an artifact
(--artifact-mb of random bytes, a whole entry of a controller cache of its own) to every node
with playbooks/fanout.yml, the way the roles send Open MPI, the Horovod wheel and the
wheelhouse: `artifact` passes it on from node to node (it needs the nodes' SSH trust: put it
after common,ssh_trust), `artifact-from-controller` sends it from the controller to each node
(artifact_cache_fanout=false), the other side of the comparison. A stage with `+cache` (e.g.
`common+cache`) runs on clusters of their own whose node1 is the package cache (group
package_cache, roles/package_cache): the tags `package_cache,STAGE`, so its first run includes
installing the cache and filling it; `--without-cache-at SIZES` runs it also without the cache at
those sizes, on fresh clusters of the same run, for the comparison. Per run it prints:

- wall: seconds the provisioning command took;
- controller CPU: user + system seconds of the whole pycli process tree (Ansible's forks
  included), from the kernel's accounting of the finished command;
- sent: megabytes the controller itself sent to the nodes (an iptables rule that counts the
  host's own packets out of the cluster's bridge, added for the run and removed after);
- inbound: megabytes that entered the cluster's network from this host in all: the above plus
  the nodes' downloads forwarded through its NAT (apt, pip). Traffic between nodes counts in
  neither;
- tasks per host: the tasks Ansible ran on each node (ok, changed, failed, skipped; a loop is
  one task), the most on any node; loop items per host: the items of those loops, each one a
  module run of its own;
- failed: hosts the run did not finish.

Then, per stage and run kind, a least-squares line cost = a + b*N for each figure and what it
predicts at 64 and 512 nodes. The line is only as good as its assumptions, printed with it:
the forks in use, the controller's cores, and that the local nodes share this machine's cores
and a bridge instead of having their own and a real link. The script judges nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYCLI = ROOT / ".venv" / "bin" / "pycli"
CLUSTER = "scale"
PREDICT_AT = (64, 512)
TASK_EVENTS = {"runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable"}
ITEM_EVENTS = {"runner_item_on_ok", "runner_item_on_failed", "runner_item_on_skipped"}
FIGURES = ("wall_s", "cpu_s", "sent_mb", "inbound_mb", "tasks_per_host", "items_per_host")
COUNTER = "pycli-scale"
# Stages that are not tags of site.yml: playbooks/fanout.yml with these extra variables.
ARTIFACT_STAGES = {"artifact": [], "artifact-from-controller": ["-e", "artifact_cache_fanout=false"]}
# A stage STAGE+cache: STAGE on a cluster whose nodes fetch their packages through node1's cache.
WITH_CACHE = "+cache"
# The stage that is all of site.yml, every tag (the package cache's play among them, so `site+cache` adds no tag).
WHOLE_SITE = "site"


@dataclass
class Run:
    nodes: int
    stage: str
    kind: str  # "first" or "no-change"
    wall_s: float
    cpu_s: float
    sent_mb: float
    inbound_mb: float
    tasks_per_host: int
    items_per_host: int
    failed: int


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares a, b of y = a + b*x; one point (or one x) gives a flat line through its mean."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return mean_y, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return mean_y - slope * mean_x, slope


def pycli(*argv: str, env: dict[str, str]) -> str:
    proc = subprocess.run([str(PYCLI), *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"pycli {' '.join(argv[:3])} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def bridge_tx_bytes(bridge: str) -> int:
    return int(Path(f"/sys/class/net/{bridge}/statistics/tx_bytes").read_text())


def own_counter(action: str, bridge: str) -> None:
    """Add (-I) or delete (-D) a rule without a target: it only counts this host's packets to the nodes."""
    subprocess.run(["iptables", action, "OUTPUT", *(["1"] if action == "-I" else []), "-o", bridge,
                    "-m", "comment", "--comment", COUNTER], check=True, capture_output=True)


def own_bytes_sent() -> int:
    listing = subprocess.run(["iptables", "-L", "OUTPUT", "-v", "-x", "-n"], check=True, capture_output=True, text=True)
    line = next((row for row in listing.stdout.splitlines() if COUNTER in row), None)
    if line is None:
        sys.exit("scale.py: the iptables counter of the controller's bytes is gone")
    return int(line.split()[1])


def cluster_bridge(name: str) -> str:
    """The host's end of the local cluster's Docker network (docker names it br-<first 12 of its id>)."""
    proc = subprocess.run(["docker", "network", "inspect", "-f", "{{.Id}}", f"pycli-{name}"],
                          capture_output=True, text=True, check=True)
    bridge = f"br-{proc.stdout.strip()[:12]}"
    if not Path(f"/sys/class/net/{bridge}").exists():
        sys.exit(f"the cluster's network has no bridge {bridge} on this host")
    return bridge


def per_host(run_folder: Path, events: set[str]) -> Counter:
    """How many of these ansible-runner events each node had in the run (the controller not counted)."""
    counts: Counter = Counter()
    for event_file in run_folder.glob("artifacts/*/job_events/*.json"):
        event = json.loads(event_file.read_text())
        host = event.get("event_data", {}).get("host")
        if event.get("event") in events and host and host != "localhost":
            counts[host] += 1
    return counts


def stage_argv(stage: str, artifact: Path) -> list[str]:
    """What `pycli provision INVENTORY` gets for a stage: its tag (with the package cache's for STAGE+cache),
    nothing for the whole site.yml, or the fan-out playbook for an artifact stage."""
    base = stage.removesuffix(WITH_CACHE)
    if base == WHOLE_SITE:
        return []
    if base not in ARTIFACT_STAGES:
        return ["--tags", base if base == stage else f"package_cache,{base}"]
    return ["--playbook", "playbooks/fanout.yml", "-e", f"fanout_entry={artifact}",
            "-e", f"fanout_dest=/var/cache/pycli/scale/{base}", *ARTIFACT_STAGES[base]]


def make_artifact(folder: Path, megabytes: int) -> Path:
    """A whole entry of a controller cache (the file and its .sha256) of random bytes."""
    partial = folder / "artifact.partial"
    with open(partial, "wb") as out:
        for _ in range(megabytes):
            out.write(os.urandom(1_000_000))
    entry = folder / "artifacts" / f"scale-{megabytes}mb"
    subprocess.run([str(ROOT / "roles" / "artifact_cache" / "files" / "cache_entry.sh"), "publish", str(partial), str(entry)],
                   check=True, capture_output=True)
    return entry


def provision(inventory: Path, argv: list[str], env: dict[str, str], bridge: str) -> tuple[float, float, float, float, Path, int]:
    """One `pycli provision INVENTORY ARGV`: wall s, CPU s of its process tree, MB sent, MB inbound, run folder, failed hosts."""
    sent_before, inbound_before = own_bytes_sent(), bridge_tx_bytes(bridge)
    started = time.monotonic()
    proc = subprocess.Popen([str(PYCLI), "provision", str(inventory), *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - started
    sent, inbound = (own_bytes_sent() - sent_before) / 1e6, (bridge_tx_bytes(bridge) - inbound_before) / 1e6
    found = re.search(r"; run folder (\S+)", output)  # provisioning's first line, whether it ends well or not
    if not found:
        sys.exit(f"pycli provision {' '.join(argv)} (exit {proc.returncode}) named no run folder:\n{output[-3000:]}")
    run_folder = Path(found.group(1))
    recap = run_folder / "recap.json"  # site.yml's runs only: a host is ok when it went through every play
    if recap.is_file():
        sys.path.insert(0, str(ROOT))
        from pycli.core.json_documents import RECAP, read_document

        failed = sum(1 for state in read_document(RECAP, recap)["hosts"].values() if state != "ok")
    else:
        failed = len(per_host(run_folder, {"runner_on_failed", "runner_on_unreachable"}))
    if proc.returncode != 0 and not failed:
        sys.exit(f"pycli provision {' '.join(argv)} failed (exit {proc.returncode}):\n{output[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, sent, inbound, run_folder, failed


def clusters(sizes: list[int], stages: list[str], without_cache_at: frozenset[int] = frozenset()) -> list[
        tuple[int, bool, list[str]]]:
    """(nodes, with the package cache, the stages run on it) for each fresh cluster the benchmark brings up:
    per size, one for the stages without the cache and one for those with it. At the sizes in
    without_cache_at each STAGE+cache stage also runs as plain STAGE, the other side of the comparison."""
    plans = []
    for nodes in sorted(set(sizes) | without_cache_at):
        plain = [s for s in stages if not s.endswith(WITH_CACHE)] if nodes in sizes else []
        cached = [s for s in stages if s.endswith(WITH_CACHE)]
        if nodes in without_cache_at:
            plain += [s.removesuffix(WITH_CACHE) for s in cached if s.removesuffix(WITH_CACHE) not in plain]
        for cache, chosen in ((False, plain), (True, cached if nodes in sizes else [])):
            if chosen:
                plans.append((nodes, cache, chosen))
    return plans


def measure(sizes: list[int], stages: list[str], ca_bundle: str, env: dict[str, str], artifact: Path,
            without_cache_at: frozenset[int] = frozenset(), opt_in: tuple[str, ...] = ()) -> list[Run]:
    runs: list[Run] = []
    inventory = ROOT / "inventory" / f"local-{CLUSTER}.ini"
    for nodes, cache, chosen in clusters(sizes, stages, without_cache_at):
        pycli("cluster", "down", "--name", CLUSTER, env=env)
        pycli("cluster", "up", "--name", CLUSTER, "--nodes", str(nodes), "--ca-bundle", ca_bundle,
              "--package-cache" if cache else "--no-package-cache", *opt_in, env=env)
        bridge = cluster_bridge(CLUSTER)
        own_counter("-I", bridge)
        try:
            for stage in chosen:
                for kind in ("first", "no-change"):
                    wall, cpu, sent, inbound, folder, failed = provision(inventory, stage_argv(stage, artifact), env, bridge)
                    tasks, items = per_host(folder, TASK_EVENTS), per_host(folder, ITEM_EVENTS)
                    run = Run(nodes, stage, kind, round(wall, 1), round(cpu, 1), round(sent, 2), round(inbound, 2),
                              max(tasks.values(), default=0), max(items.values(), default=0), failed)
                    runs.append(run)
                    print(f"scale: {nodes} node(s), {stage}, {kind}: {wall:.1f} s, CPU {cpu:.1f} s, "
                          f"sent {sent:.2f} MB (inbound {inbound:.2f} MB), {run.tasks_per_host} tasks and {run.items_per_host} loop items per host, {failed} failed", flush=True)
        finally:
            own_counter("-D", bridge)
            pycli("cluster", "down", "--name", CLUSTER, env=env)
    return runs


def forks_in_use() -> str:
    if os.environ.get("ANSIBLE_FORKS"):
        return f"{os.environ['ANSIBLE_FORKS']} (ANSIBLE_FORKS)"
    sys.path.insert(0, str(ROOT))
    from pycli.cluster.runner import FORKS_DEFAULT_HELP

    return f"pycli's default: {FORKS_DEFAULT_HELP.split(';')[0]}"


def report(runs: list[Run], artifact_mb: int) -> None:
    print(f"\n# Provisioning against cluster size, {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| stage | run | nodes | wall s | controller CPU s | sent MB | inbound MB | tasks per host | loop items per host | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r.stage} | {r.kind} | {r.nodes} | {r.wall_s} | {r.cpu_s} | {r.sent_mb} | {r.inbound_mb} | "
              f"{r.tasks_per_host} | {r.items_per_host} | {r.failed} |")
    print("\n## Fit cost = a + b*N, and what it predicts\n")
    print(f"| stage | run | figure | a | b per node | at {PREDICT_AT[0]} | at {PREDICT_AT[1]} |")
    print("|---|---|---|---|---|---|---|")
    for stage in dict.fromkeys(r.stage for r in runs):
        for kind in ("first", "no-change"):
            chosen = [r for r in runs if r.stage == stage and r.kind == kind]
            for figure in FIGURES:
                a, b = fit([(r.nodes, getattr(r, figure)) for r in chosen])
                predicted = " | ".join(f"{a + b * n:.1f}" for n in PREDICT_AT)
                print(f"| {stage} | {kind} | {figure} | {a:.2f} | {b:.3f} | {predicted} |")
    if any(r.stage in ARTIFACT_STAGES for r in runs):
        print(f"\nThe artifact stages send {artifact_mb} MB; sent MB over that is the copies the controller sent.")
    print(f"\nAssumptions: forks = {forks_in_use()}; the controller has "
          f"{os.cpu_count()} cores; the nodes are containers that share those cores and a Docker bridge, "
          "so per-node work done on the nodes (and the time it takes) lands on the same cores as the "
          "controller's, and the link is memory, not a network. A line fitted to N <= 16 says nothing "
          "about limits met past it (forks, sshd, the link).")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1,2,4,8,16", help="cluster sizes, comma-separated (default 1,2,4,8,16)")
    parser.add_argument("--stages", default="ssh_trust",
                        help="tags of site.yml, site (all of it), or artifact / artifact-from-controller, "
                             "comma-separated; STAGE+cache for the same with the package cache (default ssh_trust)")
    parser.add_argument("--artifact-mb", type=int, default=64, help="size of the artifact stages' file in MB (default 64)")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt", help="CA bundle for the nodes")
    parser.add_argument("--without-cache-at", default="",
                        help="sizes at which each STAGE+cache stage also runs without the cache, comma-separated")
    parser.add_argument("--slurm", action="store_true", help="every cluster with Slurm (cluster up --slurm)")
    parser.add_argument("--monitoring", action="store_true", help="every cluster with monitoring (cluster up --monitoring)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    for option, value in (("--nodes", args.nodes), ("--without-cache-at", args.without_cache_at or "1")):
        if not re.fullmatch(r"[1-9][0-9]*(,[1-9][0-9]*)*", value):
            parser.error(f"{option} takes sizes of at least 1 separated by commas, not {value!r}")
    sizes = sorted({int(n) for n in args.nodes.split(",")})
    without_cache_at = frozenset(int(n) for n in args.without_cache_at.split(",") if n)
    stages = [s for s in args.stages.split(",") if s]
    if args.artifact_mb < 1:
        parser.error(f"--artifact-mb takes a size of at least 1, not {args.artifact_mb}")
    with tempfile.TemporaryDirectory(prefix="pycli-scale-") as folder:
        artifact = make_artifact(Path(folder), args.artifact_mb) if set(stages) & set(ARTIFACT_STAGES) else Path(folder)
        opt_in = tuple(flag for flag, asked in (("--slurm", args.slurm), ("--monitoring", args.monitoring)) if asked)
        runs = measure(sizes, stages, args.ca_bundle, dict(os.environ), artifact, without_cache_at, opt_in)
    report(runs, args.artifact_mb)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
