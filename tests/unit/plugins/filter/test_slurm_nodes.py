"""The slurm role's defaults and the parsers of its filter plugin (plugins/filter/slurm_nodes.py), on recorded output."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from tests.conftest import PLUGINS, ROOT

ROLES = ROOT / "roles"
ROLE = ROLES / "slurm"


def _defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())


def _render(expression: str, **variables) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


def _filter():
    spec = importlib.util.spec_from_file_location("slurm_nodes", PLUGINS / "filter" / "slurm_nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.slurm_node_problems


def test_the_munge_key_folder_is_named_like_the_ssh_trust_key_s():
    # Two clusters managed from one controller never share a munge key, for the reason they never
    # share an SSH key: the same name, made the same way.
    assert _defaults("slurm")["slurm_cluster_name"] == _defaults("ssh_trust")["ssh_trust_cluster_name"]


def test_the_secrets_live_in_the_controller_s_state_folder_beside_the_ssh_key():
    # The same state folder as ssh_trust_key_dir, in a `slurm` folder of its own per cluster.
    slurm_dir = " ".join(_defaults("slurm")["slurm_secret_dir"].split())
    ssh_dir = " ".join(_defaults("ssh_trust")["ssh_trust_key_dir"].split())
    assert slurm_dir == ssh_dir.replace("'/ssh_trust/' ~ ssh_trust_cluster_name", "'/slurm/' ~ slurm_cluster_name")


@pytest.mark.parametrize(("name", "clustername"), [
    ("slurmdev", "slurmdev"), ("molecule-slurm", "molecule_slurm"), ("Prod.Lab-A", "prod_lab_a"),
    ("prod-3f4a1b2c", "prod_3f4a1b2c"),
])
def test_slurm_s_cluster_name_is_lower_case_letters_digits_and_underscores(name, clustername):
    assert _render(_defaults("slurm")["slurm_clustername"], slurm_cluster_name=name) == clustername


EXPECTED = {"node1": 4, "node2": 4}


def test_two_idle_nodes_with_their_cpus_have_no_problem():
    assert _filter()("node1|idle|4|none\nnode2|idle|4|none\n", EXPECTED) == []


def test_a_node_listed_in_two_partitions_counts_once():
    assert _filter()("node1|mixed|4|none\nnode1|mixed|4|none\nnode2|allocated|4|none\n", EXPECTED) == []


def test_a_node_missing_from_sinfo_is_named():
    assert _filter()("node1|idle|4|none\n", EXPECTED) == ["node2: not in sinfo (not in slurmctld's slurm.conf)"]


def test_a_node_that_does_not_answer_is_named():
    problems = _filter()("node1|idle|4|none\nnode2|idle*|4|none\n", EXPECTED)
    assert len(problems) == 1 and problems[0].startswith("node2: idle*, slurmd does not answer")


def test_a_down_or_unknown_node_is_named_with_its_reason():
    problems = _filter()("node1|unknown*|4|none\nnode2|down|4|Not responding\n", EXPECTED)
    assert [p.split(":")[0] for p in problems] == ["node1", "node2"]
    assert "(Not responding)" in problems[1]


def test_a_node_slurm_drained_for_less_memory_than_its_line_is_a_problem():
    problems = _filter()("node1|drained|4|Low RealMemory\nnode2|idle|4|none\n", EXPECTED)
    assert problems == ["node1: drained by Slurm: the node has less than slurm.conf says (Low RealMemory)"]


def test_a_node_a_person_drained_stays_drained_and_passes():
    assert _filter()("node1|drained|4|fenced by pycli check\nnode2|draining|4|maintenance\n", EXPECTED) == []


def test_a_node_with_other_cpus_than_slurm_conf_is_named():
    assert _filter()("node1|idle|2|none\nnode2|idle|4|none\n", EXPECTED) == ["node1: 2 CPUs, slurm.conf says 4"]


INSTALLED = """slurmd:
  Installed: 22.05.8-4+deb12u3
  Candidate: 22.05.8-4+deb12u3
  Version table:
 *** 22.05.8-4+deb12u3 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
        100 /var/lib/dpkg/status
"""
NOT_INSTALLED = """slurmd:
  Installed: (none)
  Candidate: 23.11.4-1.2ubuntu5
  Version table:
     23.11.4-1.2ubuntu5 500
        500 http://archive.ubuntu.com/ubuntu noble/universe amd64 Packages
"""
HELD_BACK = """slurmd:
  Installed: 21.08.5-2ubuntu1
  Candidate: 23.11.4-1.2ubuntu5
  Version table:
"""


def _filters():
    spec = importlib.util.spec_from_file_location("slurm_nodes", PLUGINS / "filter" / "slurm_nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _apt_version():
    return _filters().slurm_apt_version


@pytest.mark.parametrize(("policy", "version"), [
    (INSTALLED, "22.05.8-4+deb12u3"),
    (NOT_INSTALLED, "23.11.4-1.2ubuntu5"),
    # apt keeps an installed package (state: present), so the node keeps running that version.
    (HELD_BACK, "21.08.5-2ubuntu1"),
    # No slurmd in apt's lists: apt-cache prints nothing.
    ("", "(none)"),
    ("slurmd:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n", "(none)"),
])
def test_the_version_a_node_has_or_would_get(policy, version):
    assert _apt_version()(policy) == version


def test_the_installed_version_and_the_versions_apt_offers():
    filters = _filters()
    assert filters.slurm_apt_installed(INSTALLED) == "22.05.8-4+deb12u3"
    assert filters.slurm_apt_installed(NOT_INSTALLED) == "(none)" and filters.slurm_apt_installed("") == "(none)"
    assert filters.slurm_apt_has(INSTALLED, "22.05.8-4+deb12u3") and filters.slurm_apt_has(INSTALLED, "22.05*")
    assert filters.slurm_apt_has(NOT_INSTALLED, "23.11*") and not filters.slurm_apt_has(NOT_INSTALLED, "24.11*")
    # The priority lines under a version (500 http://...) are not versions.
    assert not filters.slurm_apt_has(INSTALLED, "500") and not filters.slurm_apt_has(HELD_BACK, "23.11*")
    assert filters.slurm_version_matches("22.05.8-4+deb12u3", "22.05*")
    assert not filters.slurm_version_matches("22.05.8-4+deb12u3", "23.11*") and not filters.slurm_version_matches("(none)", "*")


def test_a_pinned_version_pins_slurm_s_packages_only():
    pinned = _filters().slurm_pinned
    assert [pinned(name, "23.11*") for name in ("munge", "slurmd", "slurm-wlm-basic-plugins", "mariadb-server")] == [
        "munge", "slurmd=23.11*", "slurm-wlm-basic-plugins=23.11*", "mariadb-server"]
    assert pinned("slurmd", "") == "slurmd"


@pytest.mark.parametrize(("installed", "target", "said"), [
    # Up to two major releases ahead before 24.11; the same release or nothing installed: fine.
    ("22.05.8-4+deb12u3", "23.02.7-1", ""),
    ("22.05.8-4+deb12u3", "23.11*", ""),
    ("22.05.8-4+deb12u3", "22.05.9-1", ""),
    ("(none)", "25.11.1-1", ""),
    ("23.02.1-1", "24.11.5-1", ""),  # 24.11 reads three releases back
    ("1:24.05.1-1", "25.11*", ""),
    # Debian 12's Slurm to Debian 13's: one release too far.
    ("22.05.8-4+deb12u3", "24.11.5-1", "Slurm 22.05.8-4+deb12u3 cannot be upgraded to 24.11.5-1 in place: 24.11 reads "
                                       "the state of 23.02, 23.11, 24.05 only (jobs and accounting would be lost); "
                                       "upgrade to 23.11 first"),
    ("22.05.8", "24.05*", "Slurm 22.05.8 cannot be upgraded to 24.05* in place: 24.05 reads the state of 23.02, 23.11 "
                          "only (jobs and accounting would be lost); upgrade to 23.11 first"),
    ("24.05.1", "26.05.1", "Slurm 24.05.1 cannot be upgraded to 26.05.1 in place: 26.05 reads the state of 24.11, "
                           "25.05, 25.11 only (jobs and accounting would be lost); upgrade to 25.11 first"),
    ("23.11.4-1", "22.05.8-4", "Slurm 23.11.4-1 cannot go back to 22.05.8-4: a Slurm daemon does not read the state "
                               "files and database of a later release"),
])
def test_slurm_goes_in_place_only_as_far_as_it_reads_the_state_of(installed, target, said):
    assert _filters().slurm_upgrade_problem(installed, target) == said
