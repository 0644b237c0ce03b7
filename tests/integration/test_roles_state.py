"""What the CPU roles promise about the nodes they leave, checked on the session's provisioned
cluster: the SSH trust files, the builds' local facts, Horovod with the shipped source patch,
`playbooks/check.yml` passing, a node's lost Open MPI put back from the controller cache
without a build, and the Open MPI build compiling while the roles that do not need it run (a
failed build: test_cache_stage.py)."""

import json
import os
import re
import subprocess
from datetime import datetime
from pathlib import Path

import docker
import pytest
import yaml

from pycli.local.plan import LOCAL_BED_VARS
from tests.conftest import ANSIBLE_PLAYBOOK, ROOT, run_pycli
from tests.integration.conftest import CLUSTER, NODE_VENV, node_run
from tests.integration.test_bench_check import TINY_SYNTHETIC
from tests.integration.test_cache_stage import changed_tasks, ok_events
from tests.integration.test_node_down import _address

pytestmark = pytest.mark.integration
NODES = ("node1", "node2")
HOROVOD_VERSION = yaml.safe_load((ROOT / "roles" / "horovod" / "defaults" / "main.yml").read_text())["horovod_version"]


def _read(node: str, path: str) -> str:
    code, out = node_run(node, "cat", path)
    assert code == 0, f"{node}: {path}: {out}"
    return out


def _fact(node: str, name: str) -> dict:
    return json.loads(_read(node, f"/etc/ansible/facts.d/{name}.fact"))


def test_every_node_knows_every_other_and_the_cluster_key_works_only_from_the_nodes(provisioned_cluster):
    addresses = {node: _address(provisioned_cluster, node) for node in NODES}
    # The controller, as the nodes see it: the cluster network's gateway.
    network = docker.from_env().networks.get(f"pycli-{CLUSTER}")
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
    for node in NODES:
        known = _read(node, "/etc/ssh/ssh_known_hosts")
        for peer, address in addresses.items():
            for name in (peer, address):
                assert re.search(rf"(^|\n|,){re.escape(name)}[ ,]", known), f"{node}: {name} not in ssh_known_hosts"
        (line,) = [line for line in _read(node, "/root/.ssh/authorized_keys").splitlines() if " pycli-cluster-" in line]
        assert line.startswith('restrict,from="'), line
        allowed = line.split('from="', 1)[1].split('"', 1)[0].split(",")
        assert set(addresses.values()) <= set(allowed) and gateway not in allowed, (node, line)


def test_the_builds_record_their_versions_and_flags_and_horovod_carries_the_patch(provisioned_cluster):
    for node in NODES:
        openmpi = _fact(node, "openmpi")
        assert openmpi["version"] == LOCAL_BED_VARS["openmpi_version"], openmpi
        assert "--enable-orterun-prefix-by-default" in openmpi["configure_flags"], openmpi
        assert any(flag.startswith("--with-pmi=") for flag in openmpi["configure_flags"]), openmpi
        horovod = _fact(node, "horovod")
        assert horovod["version"] == HOROVOD_VERSION, horovod
        assert horovod["build_env"]["HOROVOD_WITH_MPI"] == "1" and horovod["build_env"]["HOROVOD_WITH_GLOO"] == "1"
        # The shipped source patch adds HandleManager::WaitHandle (ranks wait without spinning).
        code, out = node_run(node, "sh", "-c", f"grep -c WaitHandle $(find {NODE_VENV}/lib -name 'mpi_lib_v2*.so')")
        assert code == 0 and int(out.strip()) > 0, f"{node}: Horovod's PyTorch extension lacks the patch: {out}"


def test_playbooks_check_yml_runs_pycli_s_gates(provisioned_cluster, tmp_path):
    """The playbook for those who drive the cluster with ansible-playbook; `pycli check` itself
    is tested gate by gate (test_bench_check.py), so one controller is enough here."""
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(provisioned_cluster), "playbooks/check.yml",
         "-e", '{"check_controllers": ["mpi"]}'],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYCLI_RUNS": str(tmp_path / "runs")},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "gates passed" in proc.stdout, proc.stdout[-3000:]


def test_a_node_that_lost_open_mpi_gets_it_back_from_the_cache_without_a_build(provisioned_cluster, second_pycli, tmp_path):
    """This provisioning and the job after it are the second Python's pycli under make test
    (second_pycli: installed from the wheel), run from a folder of the user's, not the checkout:
    Ansible, Mitogen and the controller cache on that Python, putting back what a node lost, with
    the roles the package carries; then a job whose run folder lands beside the user's files."""
    prefix = _fact("node2", "openmpi")["prefix"]
    assert node_run("node2", "rm", "-rf", prefix)[0] == 0
    users = tmp_path / "work"
    users.mkdir()
    runs = users / "runs"  # where pycli puts run folders unless told (PYCLI_RUNS unset)
    proc = run_pycli("provision", str(provisioned_cluster), "--tags", "openmpi", env={"PYCLI_RUNS": ""},
                     timeout=1800, pycli=second_pycli, cwd=users)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # Ansible was that Python's: pycli puts its interpreter's folder first on Ansible's PATH, as
    # ansible-runner recorded it.
    (command,) = runs.glob("*-provision/artifacts/*/command")
    assert json.loads(command.read_text())["env"]["PATH"].split(os.pathsep)[0] == str(Path(second_pycli[0]).parent), command
    changed = changed_tasks(runs)
    assert changed and all(task.startswith("node2: ") for task in changed), changed
    assert not [task for task in changed if re.search(r"[Cc]onfigure|[Cc]ompile|Install into the prefix|Pack", task)], changed
    code, out = node_run("node2", f"{prefix}/bin/ompi_info", "--version")
    assert code == 0 and f"v{LOCAL_BED_VARS['openmpi_version']}" in out, out
    job = run_pycli("train", "synthetic", "-i", str(provisioned_cluster), "--np", "2", "--launcher", "mpirun", "--",
                    *TINY_SYNTHETIC, env={"PYCLI_RUNS": ""}, pycli=second_pycli, cwd=users)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:]
    named = re.search(r"pycli: job finished in .*; results in (\S+)", job.stdout)
    assert named and Path(named.group(1)).parent.parent == runs and Path(named.group(1)).is_dir(), job.stdout[-2000:]


def _task_spans(run_folder, host: str) -> list[tuple[str, str, float, float, dict]]:
    """(play, task, start, end, result) of each task that ended ok on `host`, from the run's events."""
    return [(data.get("play"), data.get("task"), *(datetime.fromisoformat(data[key]).timestamp() for key in ("start", "end")),
             data.get("res") or {}) for data in ok_events(run_folder) if data.get("host") == host and data.get("start")]


def test_the_open_mpi_build_compiles_while_the_roles_that_do_not_need_it_run(first_provisioning):
    spans = _task_spans(first_provisioning, "node1")
    waits = [res for _, task, _, _, res in spans if task == "Wait for configure, compile and install to end"]
    if not waits:  # a warm cache: nothing was built in this session's provisioning
        assert os.environ.get("CI") != "true", "CI starts from an empty cache, so its first provisioning builds Open MPI"
        pytest.skip("the controller cache had the Open MPI build: nothing compiled in this session")
    (job,) = waits
    # The build's own first and last lines: "== ISO-TIME start" and "== ISO-TIME end", on the
    # node's clock (the local nodes share this machine's).
    marks = dict(reversed(line.split()[1:3]) for line in job["stdout_lines"] if line.startswith("== "))
    build_start, build_end = (datetime.fromisoformat(marks[step]).timestamp() for step in ("start", "end"))
    during = {play for play, _, start, end, _ in spans if build_start < start and end < build_end}
    # Docker, SSH trust and Horovod's environment ran on the build node while it compiled.
    assert {"Docker Engine", "SSH trust between the nodes", "Horovod's Python environment"} <= during, (during, marks)
    # The Horovod wheel links Open MPI: it started building on the build node once Open MPI was
    # in there, and Open MPI was passed on to node2 while it compiled.
    ends = {task: end for _, task, _, end, _ in spans}
    wheel_started = ends["Start the wheel's build in the background (several minutes)"]
    wheel_built = ends["Wait for the wheel's build to end"]
    unpacked = [start for _, task, start, _, _ in _task_spans(first_provisioning, "node2") if task == "Unpack the prefix"]
    assert len(unpacked) == 1 and build_end < wheel_started < unpacked[0] < wheel_built, (marks, wheel_started, unpacked)

