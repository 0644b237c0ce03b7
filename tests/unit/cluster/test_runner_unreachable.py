"""A node that cannot be reached costs a run one SSH connect, under either strategy.

Mitogen looks for a node's Python by trying each name Ansible lists (python3.13 down to
python3), each over a new SSH connection: a dead node cost a provisioning 8 connects, so 8 times
the connect timeout (30 s in ansible.cfg), where Ansible's own strategy tries once. ansible.cfg
names the nodes' Python (/usr/bin/python3, on every distribution the roles support), so neither
strategy looks. The `ssh` on PATH here counts its calls and goes on to the real one, against a
port where nothing listens.
"""

import os
import socket
import stat
import subprocess

import pytest

from pycli.cluster import runner

pytestmark = pytest.mark.slow_ansible  # each test runs a real playbook through ansible-runner

PLAY = """\
- name: Reach the node
  hosts: nodes
  gather_facts: true
  tasks:
    - name: Say so
      ansible.builtin.debug:
        msg: reached
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.mark.parametrize("strategy", [runner.MITOGEN, runner.LINEAR])
def test_a_node_nothing_answers_on_costs_one_ssh_connect(strategy, tmp_path, monkeypatch):
    real_ssh = subprocess.run(["sh", "-c", "command -v ssh"], capture_output=True, text=True).stdout.strip()
    if not real_ssh:
        pytest.skip("no ssh client on this machine")
    calls = tmp_path / "ssh-calls"
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real_ssh} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(runner.STRATEGY_ENV, strategy)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[nodes]\ndead ansible_host=127.0.0.1 ansible_port={_closed_port()} ansible_user=root\n")
    playbook = tmp_path / "reach.yml"
    playbook.write_text(PLAY)

    result = runner.run(runner.RunRequest(inventory=inventory, playbook=playbook, many_tasks=True), tmp_path / "run")

    assert result.unreachable == ["dead"], result.hosts
    attempts = calls.read_text().splitlines()
    assert len(attempts) == 1, [attempt.split(" -c ")[0].split()[-2:] for attempt in attempts]  # host, Python
