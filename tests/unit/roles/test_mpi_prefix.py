"""The Open MPI prefix has one home, the openmpi role's openmpi_prefix: the horovod role builds
against the prefix that role recorded (a host fact in the run, the local fact on the node
otherwise), never a prefix of its own."""

from __future__ import annotations

import yaml

from tests.conftest import ROOT

ROLES = ROOT / "roles"


def _template(text: str, **variables) -> str:
    """`text` templated by Ansible with the openmpi and horovod roles' defaults and `variables`."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    def trusted(values: dict) -> dict:
        return {k: trust_as_template(v) if isinstance(v, str) else v for k, v in values.items()}

    defaults = {
        **trusted(yaml.safe_load((ROLES / "openmpi" / "defaults" / "main.yml").read_text())),
        **trusted(yaml.safe_load((ROLES / "horovod" / "defaults" / "main.yml").read_text())),
    }
    return Templar(loader=DataLoader(), variables={**defaults, **variables}).template(trust_as_template(text))


def _task(role: str, tasks: str, name: str) -> dict:
    [task] = [t for t in yaml.safe_load((ROLES / role / "tasks" / tasks).read_text()) if t["name"] == name]
    return task


def _recorded(**variables) -> dict:
    """What the openmpi role records of its prefix: the run's host fact and the node's local fact."""
    fact = _task("openmpi", "preflight.yml", "Record the prefix for the later plays of this run")
    local = _task("openmpi", "install.yml", "Record the installed version and build flags as a local fact")
    return {"run": _template(fact["ansible.builtin.set_fact"]["_openmpi_prefix"], **variables),
            "node": _template(local["vars"]["_fact"]["prefix"], **variables)}


def test_horovod_builds_against_the_prefix_the_openmpi_role_recorded_in_this_run():
    recorded = _recorded(openmpi_version="4.1.6")
    assert recorded == {"run": "/opt/openmpi-4.1.6", "node": "/opt/openmpi-4.1.6"}
    # The run's record wins over what an earlier run left on the node.
    chosen = _template("{{ horovod_mpi_prefix }}", _openmpi_prefix=recorded["run"],
                       ansible_local={"openmpi": {"prefix": "/opt/openmpi-4.1.8"}})
    assert chosen == "/opt/openmpi-4.1.6"


def test_without_the_openmpi_role_in_the_run_horovod_takes_the_node_s_record():
    recorded = _recorded(openmpi_prefix="/srv/mpi")
    chosen = _template("{{ horovod_mpi_prefix }}", ansible_local={"openmpi": {"prefix": recorded["node"]}})
    assert chosen == "/srv/mpi"


def test_with_no_record_horovod_stops_in_one_line_that_says_what_to_run():
    check = _task("horovod", "preflight.yml", "Check there is an Open MPI to build against")["ansible.builtin.assert"]
    assert _template("{{ horovod_mpi_prefix }}") == ""
    assert _template("{{ " + check["that"] + " }}") is False
    assert _template("{{ " + check["that"] + " }}", horovod_with_mpi=False) is True
    message = _template(check["fail_msg"], inventory_hostname="node1").strip()
    assert message.startswith("node1 has no Open MPI prefix to build against") and "run the openmpi role first" in message
    assert "\n" not in message


def test_the_horovod_role_writes_no_open_mpi_prefix_of_its_own():
    texts = {str(path.relative_to(ROLES)): path.read_text()
             for path in (ROLES / "horovod").rglob("*") if path.is_file() and path.suffix in {".yml", ".j2", ".md"}}
    assert texts and not [name for name, text in texts.items() if "/opt/openmpi" in text]
