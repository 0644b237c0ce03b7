"""`pycli provision` against the real local cluster: a failure, an unreachable host, the recap."""

import json
import re

import pytest

from tests.conftest import ROOT, run_pycli

pytestmark = pytest.mark.integration
PLAYBOOK = ROOT / "tests" / "fixtures" / "playbooks" / "fails_on_node2.yml"


def test_failed_task_exits_1_naming_host_task_and_message(local_cluster, tmp_path):
    proc = run_pycli("provision", str(local_cluster), "--playbook", str(PLAYBOOK), env={"PYCLI_RUNS": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "node2: Break on node2: non-zero return code" in proc.stdout
    assert proc.stdout.count("Break on node2") == 1  # shown once
    assert "FAILED" in proc.stdout and "provisioning failed" in proc.stdout
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.endswith("-provision")
    events = list((run_dir / "artifacts").rglob("job_events/*.json"))
    assert any(json.loads(p.read_text()).get("event") == "runner_on_failed" for p in events)


def test_limit_to_the_good_host_succeeds_and_rerun_changes_nothing(local_cluster, tmp_path):
    proc = run_pycli("provision", str(local_cluster), "--playbook", str(PLAYBOOK), "--limit", "node1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "provisioned 2 host(s)" in proc.stdout or "provisioned" in proc.stdout


def test_an_unreachable_host_exits_4(local_cluster, tmp_path):
    text = local_cluster.read_text()
    subnet_prefix = text.split("node1 ansible_host=")[1].split()[0].rsplit(".", 1)[0]
    # An address in the cluster's own test network where no node listens.
    ghost = text.replace("[nodes]\n", f"[nodes]\nghost ansible_host={subnet_prefix}.250\n")
    inventory = tmp_path / "with-ghost.ini"
    inventory.write_text(ghost.replace("[nodes:vars]\n", "[nodes:vars]\nansible_ssh_timeout=3\n"))
    proc = run_pycli("provision", str(inventory), "--playbook", str(PLAYBOOK), "--limit", "ghost,node1")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "UNREACHABLE" in proc.stdout and "ghost:" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/inventory.ini"], "no such inventory"),
        (["{inventory}", "--forks", "0"], "--forks must be at least 1"),
        (["{inventory}", "-e", "=1"], "expected key=value"),
        (["{inventory}", "--limit", "nosuchhost"], "--limit 'nosuchhost' matches no host"),
    ],
)
def test_bad_input_is_exit_2_and_leaves_no_run_folder(local_cluster, tmp_path, args, message):
    argv = [a.format(inventory=local_cluster) for a in args]
    proc = run_pycli("provision", *argv, "--playbook", str(PLAYBOOK), env={"PYCLI_RUNS": str(tmp_path / "runs")})
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def _node_shell(node: str, command: str) -> tuple[int, str]:
    from tests.integration.conftest import node_run

    return node_run(node, "sh", "-c", command)


def test_an_inventory_name_the_nodes_cannot_resolve_goes_into_every_nodes_etc_hosts(provisioned_cluster, tmp_path):
    # Docker's DNS resolves node1 and node2; an inventory name it does not know makes the
    # common role's one getent of all the names fail, and the role writes /etc/hosts entries.
    inventory = tmp_path / "alias.ini"
    inventory.write_text(re.sub(r"(?m)^node2 ", "pycli-alias-node2 ", provisioned_cluster.read_text()))
    address = re.search(r"(?m)^node2 ansible_host=(\S+)", provisioned_cluster.read_text()).group(1)
    try:
        proc = run_pycli("provision", str(inventory), "--tags", "common", env={"PYCLI_RUNS": str(tmp_path / "runs")})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        for node in ("node1", "node2"):
            code, out = _node_shell(node, "getent ahostsv4 pycli-alias-node2")
            assert code == 0 and out.startswith(address), (node, out)
    finally:
        for node in ("node1", "node2"):  # /etc/hosts is a bind mount: rewrite it in place
            _node_shell(node, "sed '/# BEGIN pycli cluster nodes/,/# END pycli cluster nodes/d' /etc/hosts > /tmp/hosts"
                              " && cat /tmp/hosts > /etc/hosts")
