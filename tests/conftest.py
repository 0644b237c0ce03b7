import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The roles' modules and filters (the collection pycli.cluster's plugins).
PLUGINS = ROOT / "plugins"
PYCLI = [sys.executable, "-m", "pycli"]
# The venv's ansible-playbook, as the README's activated venv has it.
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
# Every test cluster trusts this machine's CA bundle (pip behind a TLS-intercepting proxy),
# and all share one node image.
TEST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@functools.cache
def ansible_plugins() -> None:
    """Ansible's plugin loader, for the lookups and filters a template may use (the roles' own
    as pycli.cluster.NAME, from the tree's collection path): configured once a process
    (configured again, it warns that its collection finder already is)."""
    from ansible.plugins.loader import init_plugin_loader

    from pycli.core.tree import COLLECTIONS

    init_plugin_loader([str(COLLECTIONS)])


def process_gone(pid: int) -> bool:
    """Whether process `pid` has ended: gone from /proc, or a zombie. A process may end between
    any two reads of /proc, so one read decides (its state follows the last ')' of stat)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def wait_process_gone(pid: int, within_s: float = 10) -> bool:
    """Whether process `pid` ends within `within_s` seconds."""
    end = time.monotonic() + within_s
    while not process_gone(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def run_pycli(*args: str, check: bool = False, env: dict | None = None, timeout: int = 900,
              pycli: list[str] = PYCLI, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would, and capture what it prints.

    `pycli`: the command that starts it; this Python's by default. `cwd`: the folder it runs in."""
    proc = subprocess.run(
        [*pycli, *args], capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"pycli {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


# The slow kinds of test in tests/unit, each with its marker (pyproject.toml): workloads run
# under torch in subprocesses, and tasks or playbooks run by Ansible on this machine. Each is
# also `slow`, so `pytest tests/unit -m "not slow"` is the fast loop of pure functions.
SLOW_KINDS = ("slow_torch", "slow_ansible")


# torch is in the main venv alone (pyproject.toml's extra torch: its CPU wheel from local disk;
# from the index pip would fetch a CUDA build of several GB), so the unit tests that need it carry
# the marker `torch`: every slow_torch test, and every test of the modules that import torch, or a
# workload that does, at their top. make test runs them in .venv (`-m torch`) and the others under
# its second Python (`-m "not torch"`, Makefile). A module that comes to import torch and is not named here fails
# to collect under the second Python, so make test says so.
# Named by their path under tests/unit.
TORCH_MODULES = frozenset({"bench/test_report.py", "jobs/test_restarts.py", "workloads/test_allreduce.py",
                           "workloads/test_wl_idx.py", "workloads/test_workloads.py"})
HAVE_TORCH = importlib.util.find_spec("torch") is not None
UNIT_DIR = ROOT / "tests" / "unit"


def _torch_module(path: Path) -> bool:
    """Whether `path` is one of TORCH_MODULES."""
    return path.is_relative_to(UNIT_DIR) and path.relative_to(UNIT_DIR).as_posix() in TORCH_MODULES


def _needs_torch(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("slow_torch")) or _torch_module(item.path)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # Without torch such a module cannot even be imported; its tests are counted out below.
    if not HAVE_TORCH and _torch_module(collection_path):
        return True
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    if HAVE_TORCH:
        return None
    return (f"torch is not installed for this Python (the main venv alone has it: pyproject.toml's extra torch): the tests "
            f"marked torch are left out ({len(TORCH_MODULES)} modules of tests/unit not collected); make test runs them in .venv")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)
        if _needs_torch(item):
            item.add_marker(pytest.mark.torch)
    if not HAVE_TORCH:
        left_out = [item for item in items if item.get_closest_marker("torch")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("torch")]


@pytest.fixture(scope="session", autouse=True)
def _isolated_runs(tmp_path_factory):
    # Run folders of the tests go to a temporary place, not the checkout's runs/.
    os.environ.setdefault("PYCLI_RUNS", str(tmp_path_factory.mktemp("runs")))


def run_tasks_locally(tasks: list[dict], extravars: dict, cwd: Path) -> list[dict]:
    """Run tasks taken from the project's playbooks or roles on this machine, as Ansible runs
    them on a node (templating, changed_when and all); each task's result, in order.

    Only for tasks that touch paths the test gives them: they run as this user, on this machine."""
    playbook = cwd / "local-play.yml"
    play = [{"name": "local", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    playbook.write_text(json.dumps(play))
    extra = {"ansible_python_interpreter": sys.executable, **extravars}
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local",
         "-e", json.dumps(extra), str(playbook)],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=120,
    )
    start = proc.stdout.find("{")
    assert start >= 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout[start:])
    return [task["hosts"]["localhost"] for play in report["plays"] for task in play["tasks"]]
