"""site.yml's Slurm play: while the Open MPI build compiles, before the end, only for an inventory that opts in."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import ROOT

REPO = ROOT
SITE = REPO / "playbooks" / "site.yml"


def _plays() -> list[dict]:
    return yaml.safe_load(SITE.read_text())


def _slurm_play() -> dict:
    return next(play for play in _plays() if play.get("name") == "Slurm scheduler")


def _hosts(inventory_text: str, tmp_path: Path) -> list[str]:
    """The hosts the play's own pattern matches in this inventory, as ansible-playbook would resolve it."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    from ansible.vars.manager import VariableManager

    inventory_file = tmp_path / "hosts.ini"
    inventory_file.write_text(inventory_text)
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(inventory_file)])
    variables = VariableManager(loader=loader, inventory=inventory).get_vars()
    for name in _slurm_play()["vars_files"]:  # the group names (role cluster_groups's defaults)
        variables.update(yaml.safe_load((SITE.parent / name).read_text()))
    pattern = Templar(loader=loader, variables=variables).template(trust_as_template(_slurm_play()["hosts"]))
    return [host.name for host in inventory.get_hosts(pattern)]


def test_the_play_runs_while_open_mpi_compiles_and_before_the_end_of_the_run():
    # Slurm needs nothing of Open MPI's or Horovod's: it runs between the build's start and the wait for it.
    names = [play.get("name") for play in _plays()]
    assert (names.index("Start the Open MPI build on the other nodes") < names.index("Slurm scheduler")
            < names.index("Open MPI and Horovod") < names.index("End of the run"))


def test_the_play_runs_the_slurm_role_with_its_tag_and_the_facts_it_reads():
    play = _slurm_play()
    assert play["roles"] == [{"role": "slurm", "tags": ["slurm"]}]
    assert play["gather_subset"] == ["min", "hardware", "network"]


def test_an_inventory_with_a_slurm_controller_gets_slurm_on_every_node_even_under_retry(tmp_path):
    inventory = "[nodes]\nnode1\nnode2\nnode3\n\n[slurm_controller]\nnode1\n"
    assert _hosts(inventory, tmp_path) == ["node1", "node2", "node3"]
    assert "pycli_hosts" not in _slurm_play()["hosts"]


def test_an_inventory_without_a_slurm_controller_gets_no_slurm_at_all(tmp_path):
    assert _hosts("[nodes]\nnode1\nnode2\n", tmp_path) == []
    assert _hosts("[nodes]\nnode1\n\n[slurm_controller]\n", tmp_path) == []
