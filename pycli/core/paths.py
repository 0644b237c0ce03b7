"""Where pycli keeps things: the project's own files, the cache, per-cluster state, run folders."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import pycli_node
from pycli.core.errors import PycliError
from pycli.core.tree import PROJECT_ROOT

# pycli's node-side package (role pycli_node's files): its modules, and the shell scripts pycli
# sends to nodes (a job's staging, its container's entry point, the test bed's nested runtime).
NODE_PACKAGE = Path(pycli_node.__file__).resolve().parent
# The training scripts and probes that travel to the nodes, as a folder (their modules import each other).
WORKLOADS_DIR = PROJECT_ROOT / "workloads"


def project_path(*parts: str) -> Path:
    path = PROJECT_ROOT.joinpath(*parts)
    if not path.exists():
        raise PycliError(f"{path} is missing: pycli runs from a wheel built by its setup.py (pipx install, "
                         "uv tool install) or from a full checkout (pip install -e .)")
    return path


@functools.cache
def role_defaults(role: str) -> dict[str, Any]:
    """The variables of a role's defaults/main.yml, read once: the home of every value the roles
    and pycli share (the nodes' venv and work folder), so Python never writes them again."""
    import yaml

    defaults = yaml.safe_load(project_path("roles", role, "defaults", "main.yml").read_text())
    return defaults if isinstance(defaults, dict) else {}


# The controller's folders that the roles use too. Where they go under the user's home, when the
# environment names none, is role controller_folders's (its defaults), which the roles read when
# run without pycli; pycli passes both to every Ansible run it starts (folders_env), and the
# Makefile asks this module (`python -m pycli.core.paths PYCLI_CACHE`).
CACHE_ENV = "PYCLI_CACHE"
STATE_ENV = "PYCLI_STATE"


def _in_home(folder: str) -> Path:
    return Path.home() / str(role_defaults("controller_folders")[f"controller_folders_{folder}_in_home"])


def cache_dir() -> Path:
    """Downloads, wheelhouse and built artifacts, keyed by version and flags ($PYCLI_CACHE)."""
    return Path(os.environ.get(CACHE_ENV) or _in_home("cache"))


def state_dir() -> Path:
    """Per-cluster secrets and host keys that must outlive a run ($PYCLI_STATE)."""
    return Path(os.environ.get(STATE_ENV) or _in_home("state"))


def folders_env() -> dict[str, str]:
    """The cache and state folders as the environment variables the roles read."""
    return {CACHE_ENV: str(cache_dir()), STATE_ENV: str(state_dir())}


def ssh_control_dir() -> Path:
    """The sockets of pycli's shared SSH connections (pycli.cluster.nodes): a short path, as a socket's
    path may hold at most 107 bytes, private to this user."""
    path = Path(tempfile.gettempdir()) / f"pycli-ssh-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.getuid() or path.stat().st_mode & 0o077:
        raise PycliError(f"{path} must be a folder of this user's that nobody else can read (it holds SSH sockets)")
    return path


def runs_dir() -> Path:
    """Where each command's run folder goes ($PYCLI_RUNS, default ./runs)."""
    return Path(os.environ.get("PYCLI_RUNS") or Path.cwd() / "runs")


def new_run_dir(command: str) -> Path:
    """A fresh runs/<time>-<command>/ folder for one command's artifacts, private to its owner
    (it holds what Ansible printed about the nodes); a runs folder pycli makes is private too."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = runs_dir()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = base / f"{stamp}-{command}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = base / f"{stamp}-{command}-{suffix}"
    path.mkdir(mode=0o700)
    return path


def main(argv: list[str]) -> int:
    """`python -m pycli.core.paths [NAME]`: the one folder NAME names (PYCLI_CACHE or PYCLI_STATE),
    or without NAME both as NAME=folder words, for the roles run by hand and the Makefile."""
    folders = folders_env()
    if not argv:
        print(" ".join(f"{name}={folder}" for name, folder in folders.items()))
        return 0
    if len(argv) == 1 and argv[0] in folders:
        print(folders[argv[0]])
        return 0
    print(f"usage: python -m pycli.core.paths [{' | '.join(folders)}]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
