#!/usr/bin/env python3
"""Provisioning time of playbooks/site.yml on fresh local nodes: cold cache, warm cache, no-change.

    .venv/bin/python benchmarks/provision.py              # cold + warm + no-change (cold builds: ~30 min on 2 cores)
    .venv/bin/python benchmarks/provision.py --skip-cold  # warm + no-change, with the cache in $PYCLI_CACHE

Each phase starts from fresh node containers (`pycli cluster up`) except the no-change runs,
which re-run site.yml on the nodes just provisioned. "Cold" uses an empty cache directory, so
everything is downloaded and built; "warm" reuses that cache (or $PYCLI_CACHE with --skip-cold).
Goals (issue 4): warm cache, 2 fresh nodes < 300 s; a no-change re-run < 60 s with changed=0.
The figures go to stdout as a table and, with --json, to a file.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
GOALS_S = {"warm": 300.0, "no-change": 60.0}
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def sh(argv: list[str], env: dict[str, str], log: Path | None = None) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    if log:
        log.write_text(output)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} ... failed (exit {proc.returncode}); output in {log or 'stderr'}:\n{output[-3000:]}")
    return elapsed, output


def cluster_up(name: str, inventory: Path, ca_bundle: str, env: dict[str, str]) -> None:
    sh([str(VENV_BIN / "pycli"), "cluster", "up", "--name", name, "--nodes", "2", "--output", str(inventory),
        "--ca-bundle", ca_bundle], env)


def cluster_down(name: str, env: dict[str, str]) -> None:
    sh([str(VENV_BIN / "pycli"), "cluster", "down", "--name", name], env)


def provision(phase: str, inventory: Path, extra_vars: Path | None, env: dict[str, str], logs: Path) -> dict:
    log = logs / f"{phase}.log"
    extra = ["-e", f"@{extra_vars}"] if extra_vars else []
    elapsed, output = sh(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), *extra, "playbooks/site.yml"], env, log,
    )
    recap = {host: {"ok": int(ok), "changed": int(ch), "failed": int(fa)} for host, ok, ch, _, fa in RECAP.findall(output)}
    return {"phase": phase, "seconds": round(elapsed, 1), "changed": sum(h["changed"] for h in recap.values()),
            "recap": recap, "log": str(log)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="bench", help="local cluster name (default: bench)")
    parser.add_argument("--skip-cold", action="store_true", help="only warm + no-change, with the cache in $PYCLI_CACHE")
    parser.add_argument("--extra-vars", type=Path,
                        help="a vars file on top of the test bed's settings, which `pycli cluster up` writes into the inventory")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    env = dict(os.environ)
    logs = Path(tempfile.mkdtemp(prefix="pycli-bench-"))
    if not args.skip_cold:
        env["PYCLI_CACHE"] = str(logs / "cache")  # empty: everything is fetched and built
    # The fetch of the test OpenMPI tarball belongs to the cold run: nothing is pre-seeded.
    inventory = logs / "hosts.ini"
    results = []
    try:
        phases = ([] if args.skip_cold else ["cold"]) + ["warm"]
        for phase in phases:
            cluster_down(args.name, env)
            cluster_up(args.name, inventory, args.ca_bundle, env)
            results.append(provision(phase, inventory, args.extra_vars, env, logs))
            results.append(provision(f"no-change after {phase}", inventory, args.extra_vars, env, logs))
    finally:
        cluster_down(args.name, env)

    from pycli.core.paths import CACHE_ENV, cache_dir

    print(f"\nprovisioning 2 fresh local nodes (logs in {logs}; cache {env.get(CACHE_ENV) or cache_dir()})")
    print(f"{'phase':<24}{'seconds':>10}{'changed':>10}  goal")
    for r in results:
        kind = "no-change" if r["phase"].startswith("no-change") else r["phase"]
        goal = GOALS_S.get(kind)
        verdict = "" if goal is None else f"< {goal:.0f} s {'met' if r['seconds'] < goal else 'MISSED'}"
        if kind == "no-change":
            verdict += f", changed=0 {'met' if r['changed'] == 0 else 'MISSED'}"
        print(f"{r['phase']:<24}{r['seconds']:>10.1f}{r['changed']:>10}  {verdict}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    missed = [r for r in results if r["phase"].startswith("no-change") and r["changed"] != 0]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
