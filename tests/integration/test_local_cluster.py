"""A real local cluster: nodes reached over real SSH with host keys checked, and a clean down."""

import json
import subprocess

import docker
import pytest

from pycli.cluster import runner
from pycli.local.cluster import LABEL_CLUSTER
from tests.conftest import TEST_CA_BUNDLE, run_pycli
from tests.integration.conftest import CLUSTER, node_run

pytestmark = pytest.mark.integration


def _vars(inventory):
    text = inventory.read_text()
    key = text.split("ansible_ssh_private_key_file=")[1].split()[0]
    known_hosts = text.split("UserKnownHostsFile=")[1].split("'")[0]
    address = text.split("node1 ansible_host=")[1].split()[0]
    return key, known_hosts, address


def test_every_node_answers_ansible_over_ssh(local_cluster, tmp_path):
    result = runner.run(runner.RunRequest(inventory=local_cluster, pattern="nodes", module="ping"), tmp_path / "run")
    assert result.status == "successful", result.hosts
    assert sorted(result.hosts) == ["node1", "node2"]
    assert all(h.ok == 1 and not h.unreachable for h in result.hosts.values())


def test_node1_resolves_node2_by_name(local_cluster, tmp_path):
    result = runner.run(
        runner.RunRequest(inventory=local_cluster, pattern="node1", module="command", module_args="getent hosts node2"),
        tmp_path / "run",
    )
    assert result.status == "successful", result.hosts["node1"].messages
    events = (tmp_path / "run" / "artifacts").rglob("job_events/*.json")
    outputs = [json.loads(p.read_text()).get("event_data", {}).get("res", {}).get("stdout", "") for p in events]
    assert any("node2" in out for out in outputs)


def test_host_keys_are_checked_not_trusted_on_first_use(local_cluster, tmp_path):
    key, known_hosts, address = _vars(local_cluster)
    base = ["ssh", "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10"]
    ok = subprocess.run([*base, "-o", f"UserKnownHostsFile={known_hosts}", f"root@{address}", "hostname"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == "node1", ok.stderr
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    refused = subprocess.run([*base, "-o", f"UserKnownHostsFile={empty}", f"root@{address}", "hostname"],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "Host key verification failed" in refused.stderr


# One process reads another's memory with process_vm_readv, as Open MPI's shared-memory single
# copy (CMA) does between two ranks of a node; in a container that the seccomp profile refuses it
# to, a job's large messages print "Read -1, expected ..., errno = 1".
_CMA_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
shared = ctypes.create_string_buffer(b"the parent's bytes", 64)
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.read(r, 1)
    os._exit(0)
copy = ctypes.create_string_buffer(64)
mine, theirs = iovec(ctypes.cast(copy, ctypes.c_void_p), 64), iovec(ctypes.cast(shared, ctypes.c_void_p), 64)
read = libc.process_vm_readv(child, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
errno = ctypes.get_errno()
os.write(w, b"x")
os.waitpid(child, 0)
print(read, errno, copy.value.decode())
"""


def test_a_process_may_read_another_of_its_node_as_open_mpi_single_copy_does(local_cluster):
    code, output = node_run("node1", "python3", "-c", _CMA_PROBE)
    assert code == 0 and output.strip().split(maxsplit=2) == ["64", "0", "the parent's bytes"], output


def test_second_up_of_the_same_cluster_says_it_is_already_up(local_cluster):
    proc = run_pycli("cluster", "up", "--name", CLUSTER, "--nodes", "2", "--slots", "1", "--output", str(local_cluster))
    assert proc.returncode == 0, proc.stderr
    assert "already up" in proc.stdout


def test_up_with_another_node_count_is_a_clash_and_changes_nothing(local_cluster):
    before = local_cluster.read_text()
    proc = run_pycli("cluster", "up", "--name", CLUSTER, "--nodes", "3")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "already exists" in proc.stderr and "Traceback" not in proc.stderr
    assert local_cluster.read_text() == before
    assert len(docker.from_env().containers.list(filters={"label": f"{LABEL_CLUSTER}={CLUSTER}"})) == 2


def test_an_overlapping_subnet_is_refused_before_anything_is_made(local_cluster):
    taken = docker.from_env().networks.get(f"pycli-{CLUSTER}").attrs["IPAM"]["Config"][0]["Subnet"]
    proc = run_pycli("cluster", "up", "--name", f"{CLUSTER}-x", "--nodes", "1", "--subnet", taken,
                     "--ca-bundle", TEST_CA_BUNDLE)
    assert proc.returncode == 2 and "overlaps" in proc.stderr and proc.stderr.count("\n") == 1
    assert not docker.from_env().containers.list(all=True, filters={"label": f"{LABEL_CLUSTER}={CLUSTER}-x"})


def test_docker_unreachable_is_one_line_exit_2_and_makes_nothing(docker_engine, tmp_path):
    inventory = tmp_path / "never.ini"
    proc = run_pycli("cluster", "up", "--name", f"{CLUSTER}-n", "--nodes", "1", "--output", str(inventory),
                     env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("pycli: error: cannot reach the Docker engine") and proc.stderr.count("\n") == 1
    assert "host-prereqs.sh" in proc.stderr
    assert not inventory.exists()


def test_down_removes_containers_network_inventory_and_keys(docker_engine, tmp_path):
    name = f"{CLUSTER}-d"
    inventory = tmp_path / "down.ini"
    client = docker.from_env()
    run_pycli("cluster", "up", "--name", name, "--nodes", "1", "--output", str(inventory),
              "--ca-bundle", TEST_CA_BUNDLE, check=True)
    assert inventory.exists()
    assert client.networks.list(names=[f"pycli-{name}"])
    run_pycli("cluster", "down", "--name", name, check=True)
    assert not client.containers.list(all=True, filters={"label": f"{LABEL_CLUSTER}={name}"})
    assert not client.networks.list(names=[f"pycli-{name}"])
    assert not inventory.exists()
    again = run_pycli("cluster", "down", "--name", name, check=True)
    assert "nothing to remove" in again.stdout


def test_ansible_through_pycli_refuses_a_host_whose_key_is_not_known(local_cluster, tmp_path):
    # ansible-runner switches host-key checking off by default; pycli's adapter must not let it.
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    key, known_hosts, _ = _vars(local_cluster)
    inventory = tmp_path / "unknown-keys.ini"
    # A fresh connection: an open ControlPersist master from an earlier test would skip the check.
    inventory.write_text(local_cluster.read_text().replace(known_hosts, f"{empty} -o ControlPath=none"))
    result = runner.run(runner.RunRequest(inventory=inventory, pattern="node1", module="ping"), tmp_path / "run")
    assert result.unreachable == ["node1"]
    message = " ".join(result.hosts["node1"].messages)
    # OpenSSH's words (Ansible's linear strategy), or Mitogen's, which pycli's runs use.
    assert any(words in message for words in ("Host key verification failed", "you have requested strict checking",
                                              "SSH reported an unrecognized or mismatching host key")), message
