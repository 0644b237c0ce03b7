import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYCLI = [sys.executable, "-m", "pycli"]
# The venv's ansible-playbook, as the README's activated venv has it.
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
# Every test cluster trusts this machine's CA bundle (pip behind a TLS-intercepting proxy),
# and all share one node image.
TEST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@functools.cache
def ansible_plugins() -> None:
    """Ansible's plugin loader, for the lookups a template may use: configured once a process
    (configured again, it warns that its collection finder already is)."""
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader()


def run_pycli(*args: str, check: bool = False, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would, and capture what it prints."""
    proc = subprocess.run(
        [*PYCLI, *args], capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"pycli {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


# The slow kinds of test in tests/unit, each with its marker (pyproject.toml): workloads run
# under torch in subprocesses, and tasks or playbooks run by Ansible on this machine. Each is
# also `slow`, so `pytest tests/unit -m "not slow"` is the fast loop of pure functions.
SLOW_KINDS = ("slow_torch", "slow_ansible")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)


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
