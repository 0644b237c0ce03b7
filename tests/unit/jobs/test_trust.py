"""pycli.jobs.trust: the launcher's logins to its peers, probed while staging, before any rank starts."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest

from pycli.cluster.model import Cluster, Host
from pycli.jobs import files as job_files
from pycli.jobs import train
from pycli.jobs import trust as job_trust
from pycli.jobs.containers import JobContainer
from pycli.jobs.launch import NodeLayout

# The fake ssh refuses this address as a stale known_hosts would.
STALE = "10.9.0.2"


def _plan(tmp_path: Path, hosts: int = 3, **request):
    nodes = tuple(Host(f"n{i}", f"10.9.0.{i}", user="root", slots=1) for i in range(1, hosts + 1))
    cluster = Cluster(hosts=nodes, launcher="n1", inventory=tmp_path / "inventory.ini")
    layout = NodeLayout(work_dir=PurePosixPath(tmp_path / "srv"))
    args = {"np": hosts, "workload": "synthetic", **request}
    return train.plan_job(cluster, train.JobRequest.of(**args), layout=layout, job_id="20261128-180000-1")


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """`ssh` that runs its command here, except the launcher's login to STALE (`true`), refused as
    OpenSSH refuses one (pycli's own logins, from the controller, pass)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(
        "#!/bin/bash\n"
        f'if [ "${{@: -2:1}}" = {STALE} ] && [ "${{@: -1}}" = true ]; then\n'
        f'  echo "No ED25519 host key is known for {STALE} and you have requested strict checking." >&2\n'
        '  echo "Host key verification failed." >&2; exit 255\nfi\n'
        'exec bash -c "${@: -1}"\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_the_launcher_logs_in_to_its_peers_under_horovodrun_and_mpirun_only(tmp_path):
    assert [h.name for h in job_trust.peers(_plan(tmp_path))] == ["n2", "n3"]
    assert [h.name for h in job_trust.peers(_plan(tmp_path, launcher="mpirun"))] == ["n2", "n3"]
    assert job_trust.peers(_plan(tmp_path, launcher="torchrun")) == []  # pycli starts every node's agent
    assert job_trust.peers(replace(_plan(tmp_path, launcher="mpirun"), slurm=True)) == []  # srun starts the ranks
    assert job_trust.peers(_plan(tmp_path, container=JobContainer(image="img"))) == []  # the job's own sshd and key
    assert job_trust.peers(_plan(tmp_path, hosts=1)) == []


def test_the_probe_names_each_peer_it_cannot_log_in_to_with_ssh_s_last_line(fake_ssh):
    hosts = [Host("n2", STALE), Host("n3", "10.9.0.3"), Host("n4", STALE, port=2222)]
    ran = subprocess.run(["bash", "-c", job_trust.probe_line(hosts)], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    said = "Host key verification failed."
    assert job_trust.parse_probe(ran.stdout) == {"n2": said, "n4": said}


def test_a_peer_the_launcher_cannot_log_in_to_stops_the_job_while_staging_in_one_line(tmp_path, fake_ssh):
    plan = _plan(tmp_path)
    with pytest.raises(job_trust.Untrusted) as caught:
        job_files.stage(plan, tmp_path)
    assert list(caught.value.failed) == [plan.hosts[1]]
    line = caught.value.line(tmp_path / "inventory.ini")
    assert line == (f"job not started: n1, the launcher, cannot log in to n2 ({STALE}): Host key verification failed.; "
                    f"the nodes' SSH trust is out of date or a node is down: "
                    f"'pycli provision {tmp_path / 'inventory.ini'} --tags ssh_trust' puts it back")
    assert "\n" not in line


def test_a_job_whose_peers_all_answer_stages_as_before(tmp_path, fake_ssh):
    plan = _plan(tmp_path, hosts=1)
    staged = job_files.stage(replace(plan, hosts=(*plan.hosts, Host("n3", "10.9.0.3", user="root"))), tmp_path)
    assert {name for name, _ in staged.node_cpus} == {"n1", "n3"}
