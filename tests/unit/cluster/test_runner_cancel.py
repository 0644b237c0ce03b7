"""Ctrl-C while Ansible runs: the run stops cleanly (nothing it started is left) and the caller hears of it."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pycli.cluster import runner

pytestmark = pytest.mark.slow_ansible  # each test runs a real playbook through ansible-runner


def _local_inventory(tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return inventory


def _sleepers(marker: str) -> str:
    """The `sleep MARKER` processes the task started. Anchored: Ansible's own command line holds
    `-a sleep MARKER` too, and a match on it cancelled the run while Ansible was still starting
    its worker, which then ran the sleep unseen (a failure seen beside a cold build)."""
    return subprocess.run(["pgrep", "-af", f"^sleep {marker}$"], capture_output=True, text=True).stdout


def test_ctrl_c_cancels_the_run_and_raises_keyboard_interrupt(tmp_path):
    marker = "97.5"  # a sleep no other process runs
    request = runner.RunRequest(inventory=_local_inventory(tmp_path), pattern="localhost",
                                module="ansible.builtin.command", module_args=f"sleep {marker}")

    def ctrl_c_once_it_sleeps():
        deadline = time.monotonic() + 60
        while not _sleepers(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN when started in the background
    threading.Thread(target=ctrl_c_once_it_sleeps, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        runner.run(request, tmp_path / "run")
    assert time.monotonic() - started < 60
    deadline = time.monotonic() + 10
    while _sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _sleepers(marker)
    assert signal.getsignal(signal.SIGINT) is before  # the handler pycli found is back


def _cancel_once_it_sleeps(tmp_path, marker: str) -> None:
    """A run of `sleep MARKER` cancelled once the sleep runs: it says canceled, and no sleep is left."""
    request = runner.RunRequest(inventory=_local_inventory(tmp_path), pattern="localhost",
                                module="ansible.builtin.command", module_args=f"sleep {marker}")
    result = runner.run(request, tmp_path / "run", cancel=lambda: bool(_sleepers(marker)))
    assert result.status == "canceled"
    deadline = time.monotonic() + 10
    while _sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _sleepers(marker)


def test_a_cancel_callback_stops_ansible_s_workers_too_and_the_run_says_canceled(tmp_path):
    """As `pycli provision` cancels: Ansible's workers (sessions of their own) must not go on unseen."""
    _cancel_once_it_sleeps(tmp_path, "97.25")


def test_workers_that_ansible_leaves_behind_are_ended_when_the_run_is_canceled(tmp_path, monkeypatch):
    """Should Ansible never pass the cancel on to its workers (its SIGINT lost, or Ansible killed
    at the end of the grace), what they started must still end with the run, not go on unseen."""
    monkeypatch.setattr(runner, "_ansible_children", lambda: [])  # the SIGINT reaches no one
    monkeypatch.setattr(runner, "CANCEL_GRACE_S", 1)  # then ansible-runner SIGKILLs Ansible's group
    _cancel_once_it_sleeps(tmp_path, "97.125")
