"""site.yml's groups: its plays run on pycli's group names, and a role's group variable that
names another group stops the run in one line before any node is reached (playbooks/cache.yml,
`site_groups`). No role names a group of its own accord: each takes it from a variable."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from pycli.cluster.inventory_writer import MONITORING_GROUP, NODES_GROUP, PACKAGE_CACHE_GROUP, SLURM_CONTROLLER_GROUP
from tests.conftest import ANSIBLE_PLAYBOOK, ROOT, run_pycli

PYCLI_GROUPS = {NODES_GROUP, SLURM_CONTROLLER_GROUP, MONITORING_GROUP, PACKAGE_CACHE_GROUP}
CHECK_PLAY = "Check there are nodes to work on"


GROUPS = yaml.safe_load((ROOT / "roles" / "cluster_groups" / "defaults" / "main.yml").read_text())


def _named(value: str) -> str:
    """The group a `{{ cluster_groups_X }}` names (role cluster_groups's defaults)."""
    found = re.fullmatch(r"\{\{ (cluster_groups_\w+) \}\}", str(value))
    assert found, value
    return GROUPS[found.group(1)]


def _site_groups() -> dict[str, str]:
    plays = yaml.safe_load((ROOT / "playbooks" / "cache.yml").read_text())
    return {name: _named(value)
            for name, value in next(play for play in plays if play["name"] == CHECK_PLAY)["vars"]["site_groups"].items()}


def _role_group_defaults() -> dict[str, str]:
    """Every role default that names an inventory group: a `*_group` whose default is a cluster_groups_* name."""
    found = {}
    for defaults in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for name, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if name.endswith("_group") and "cluster_groups_" in str(value):
                found[name] = _named(value)
    return found


def test_the_check_knows_every_roles_group_variable_with_its_default():
    assert _site_groups() == _role_group_defaults()
    assert set(_site_groups().values()) == PYCLI_GROUPS == set(GROUPS.values())


def test_no_playbook_or_role_names_a_group_but_role_cluster_groups():
    """pycli's Python reads them there too (inventory_writer), so a group is named once."""
    literal = re.compile(r"(hosts:\s*['\"]?|groups\[\s*['\"]|default\(['\"])(nodes|slurm_controller|monitoring|package_cache)\b")
    sources = [*ROOT.glob("playbooks/*.yml"), *ROOT.glob("roles/*/*/*.yml"), *ROOT.glob("roles/*/templates/*.j2")]
    assert len(sources) > 50
    assert [str(p.relative_to(ROOT)) for p in sources if literal.search(p.read_text())] == []


def test_no_role_names_a_group_itself():
    literal = re.compile(r"groups\[\s*['\"]")
    named = [f"{path.relative_to(ROOT)}:{number}" for path in sorted(ROOT.glob("roles/**/*"))
             if path.is_file() and path.suffix in {".yml", ".yaml", ".j2"}
             for number, line in enumerate(path.read_text().splitlines(), 1) if literal.search(line)]
    assert named == []


def _inventory(tmp_path: Path, extra: str = "") -> Path:
    """Two nodes nothing answers for (port 9 of this host's loopback refuses at once), Slurm on node1."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "[nodes]\nnode1 ansible_host=127.0.0.1 ansible_port=9\nnode2 ansible_host=127.0.0.2 ansible_port=9\n\n"
        f"[head]\nnode1\n\n[slurm_controller]\nnode1\n\n[all:vars]\n{extra}")
    return inventory


def _site(inventory: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True"}
    env.pop("ANSIBLE_INVENTORY", None)
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inventory), *args, "playbooks/site.yml"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("where", "args"), [("inventory", ()), ("-e", ("-e", "slurm_controller_group=head"))])
def test_a_renamed_group_stops_site_yml_before_any_node_is_reached(tmp_path, where, args):
    extra = "slurm_controller_group=head\n" if where == "inventory" else ""
    proc = _site(_inventory(tmp_path, extra), *args)
    assert proc.returncode != 0
    assert ("slurm_controller_group is 'head' for node1, node2, and site.yml runs that role on group "
            "'slurm_controller': name the group [slurm_controller]") in " ".join(proc.stdout.split()), proc.stdout
    assert "UNREACHABLE" not in proc.stdout and "Gathering Facts" not in proc.stdout, proc.stdout[-3000:]


def test_the_product_names_pass_the_check_and_the_run_goes_on_to_the_nodes(tmp_path):
    proc = _site(_inventory(tmp_path, "slurm_controller_group=slurm_controller\nssh_trust_cluster_group=nodes\n"))
    assert proc.returncode != 0  # nothing answers on the nodes
    assert "site.yml runs that role on group" not in proc.stdout
    assert "UNREACHABLE" in proc.stdout, proc.stdout[-3000:]


def test_pycli_provision_says_it_in_one_line(tmp_path):
    proc = run_pycli("provision", str(_inventory(tmp_path, "ssh_trust_cluster_group=head\n")),
                     env={"PYCLI_RUNS": str(tmp_path / "runs")}, timeout=300)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "site.yml runs that role on group" in line]
    assert len(lines) == 1 and "ssh_trust_cluster_group is 'head' for node1, node2" in lines[0], proc.stdout + proc.stderr
    assert "name the group [nodes] in the inventory" in lines[0]
    assert "Traceback" not in proc.stderr
