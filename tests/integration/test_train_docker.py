"""`pycli train --docker IMAGE` on the provisioned 2-node cluster: every rank in a job container.

No registry is reachable here, so the image is made on each node from the node's own system
(the job_image fixture, tests/fixtures/job_image.yml): Python with torch and Horovod, Open MPI,
OpenSSH. `--docker` through Slurm is test_slurm's.
"""

import json
import subprocess

import docker
import pytest

from pycli.local.cluster import LABEL_CLUSTER
from pycli.local.dockerapi import run_in
from tests.conftest import ANSIBLE_PLAYBOOK, ROOT, run_pycli
from tests.integration.conftest import CLUSTER
from tests.integration.test_train import FAST, interrupt_a_running_job, records, results_of, train

pytestmark = pytest.mark.integration


def on_nodes(*argv):
    """{node: (exit code, output)} of a command run in every node of the session's cluster."""
    client = docker.from_env()
    found = {}
    for container in client.containers.list(filters={"label": f"{LABEL_CLUSTER}={CLUSTER}"}):
        code, out = run_in(container.name, argv)
        found[container.name] = (code, out.strip())
    return found


def job_containers():
    return {node: out for node, (_, out) in on_nodes("docker", "ps", "-aq", "--filter", "label=io.pycli.job").items()}


def test_every_rank_runs_in_a_job_container_that_checks_host_keys(provisioned_cluster, job_image):
    node2 = provisioned_cluster.read_text().split("\nnode2 ansible_host=")[1].split()[0]
    proc = train(provisioned_cluster, "tests/fixtures/container_probe.py", "--np", "2", "--docker", job_image, "--", node2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"inside {job_image} containers" in proc.stdout
    probes = sorted((json.loads(l.split("PROBE ", 1)[1]) for l in proc.stdout.splitlines() if "PROBE " in l),
                    key=lambda p: p["rank"])
    assert [(p["rank"], p["host"], p["size"]) for p in probes] == [(0, "node1", 2), (1, "node2", 2)]
    # PID 1 of each rank's namespace is the container's sshd: no rank ran on a bare node.
    assert all(p["pid1"] == "sshd" and p["horovodrun_checks_host_keys"] for p in probes), probes
    assert probes[0]["ssh_peer"] == [0, "sshd"]
    assert probes[0]["ssh_unknown_key"] == [255, ["Host key verification failed."]]
    assert not any(job_containers().values()), job_containers()
    run_dir = results_of(proc).parent
    assert sorted(p.name for p in (run_dir / "container").iterdir()) == ["authorized_keys", "entry.sh", "known_hosts", "start.sh"]


def test_mnist_with_mpirun_inside_containers_brings_back_metrics(provisioned_cluster, job_image, tmp_path):
    # Two ranks a node: Open MPI's shared memory between a node's ranks reads the other's
    # memory straight (process_vm_readv), which the container allows (SYS_PTRACE); refused, every
    # large message would print "Read -1, expected N, errno = 1".
    text = provisioned_cluster.read_text().replace("\nslots=1\n", "\nslots=2\n")
    assert "\nslots=2\n" in text
    (inventory := tmp_path / "two-slots.ini").write_text(text)
    proc = train(inventory, "mnist", "--np", "4", "--launcher", "mpirun", "--docker", job_image,
                 "--", "--epochs", "2", *FAST)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "4 process(es) on node1, node2 via mpirun" in proc.stdout, proc.stdout[-3000:]
    assert "errno = 1" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    got = records(results_of(proc))
    assert [r["epoch"] for r in got] == [1, 2] and all(r["ranks"] == 4 for r in got)
    assert got[-1]["val_accuracy"] > 0.3  # chance is 0.1
    assert (results_of(proc) / "checkpoints" / "last.pt").is_file()


def test_ctrl_c_removes_the_job_containers(provisioned_cluster, job_image):
    def both_nodes_run_the_job_container():
        assert all(job_containers().values()), "both nodes should run the job's container"

    code, rest = interrupt_a_running_job(provisioned_cluster, "--docker", job_image,
                                         while_running=both_nodes_run_the_job_container)
    assert code == 130, rest[-3000:]
    assert not any(job_containers().values()), job_containers()
    ranks = on_nodes("pgrep", "-f", "synthetic.py")
    assert all(code == 1 for code, _ in ranks.values()), ranks


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("pycli-test/horovod-no-sshd:1", "the image has no sshd: install openssh-server in it"),
        ("pycli-test/not-built:1", "is not on the node and cannot be pulled"),
    ],
)
def test_an_unusable_image_is_one_clear_line(provisioned_cluster, job_image, image, message):
    proc = run_pycli("train", "mnist", "--np", "2", "--docker", image, "-i", str(provisioned_cluster))
    assert proc.returncode == 1 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "node1, node2: " in proc.stderr  # the same failure on both nodes, said once
    assert not any(job_containers().values()), job_containers()


def test_the_docker_role_gives_containers_1g_of_shared_memory_ipc_host_and_its_users_the_group(provisioned_cluster,
                                                                                                job_image):
    """What the docker role promises beyond a working engine, checked on the shared cluster."""
    for node, (code, text) in on_nodes("cat", "/etc/docker/daemon.json").items():
        config = json.loads(text)
        # The role's own option and the inventory's (the bed's nested runtime), merged in one file.
        assert code == 0 and config["default-shm-size"] == "1G", (node, text)
        assert config["default-runtime"] == "runc-nested", (node, text)
    on_nodes("sh", "-c", "echo pycli > /dev/shm/pycli-ipc-marker")
    # NCCL in a container needs the host's /dev/shm (--ipc=host); without it a container gets 1G, not 64M.
    for node, (code, out) in on_nodes("docker", "run", "--rm", "--ipc=host", job_image,
                                      "cat", "/dev/shm/pycli-ipc-marker").items():
        assert (code, out) == (0, "pycli"), (node, out)
    for node, (code, out) in on_nodes("docker", "run", "--rm", job_image, "df", "-k", "--output=size", "/dev/shm").items():
        assert code == 0 and out.splitlines()[-1].strip() == "1048576", (node, out)
    on_nodes("rm", "-f", "/dev/shm/pycli-ipc-marker")

    user = "pycli-test-docker-user"
    on_nodes("useradd", "--no-create-home", user)
    try:
        proc = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", str(provisioned_cluster), "playbooks/site.yml",
             "--tags", "docker_config", "--limit", "node2", "-e", json.dumps({"docker_users": [user]})],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        groups = on_nodes("id", "-nG", user)
        assert "docker" in groups["pycli-" + CLUSTER + "-node2"][1].split(), groups
        assert "docker" not in groups["pycli-" + CLUSTER + "-node1"][1].split(), groups
    finally:
        on_nodes("userdel", user)
