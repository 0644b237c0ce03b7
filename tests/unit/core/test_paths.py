"""The controller's cache and state folders have one home, role controller_folders: the roles that
keep files there read it (they depend on it), and so does pycli (pycli.core.paths), which passes
both to every Ansible run it starts. A role run without pycli finds the same folders."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from pycli.cluster.runner import runner_env
from pycli.core import paths
from tests.conftest import ROOT, ansible_plugins

# Each role's variable for a folder and where it is in the folder pycli names.
ROLE_FOLDERS = [
    ("artifact_cache", "artifact_cache_dir", paths.cache_dir, ""),
    ("ssh_trust", "ssh_trust_key_dir", paths.state_dir, "/ssh_trust/lab"),
    ("slurm", "slurm_secret_dir", paths.state_dir, "/slurm/lab"),
]


def _role_default(role: str, name: str) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    ansible_plugins()  # the lookups are ansible.builtin's, found through the collection loader
    expression = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())[name]
    shared = yaml.safe_load((ROOT / "roles" / "controller_folders" / "defaults" / "main.yml").read_text())
    variables = {**{key: trust_as_template(value) for key, value in shared.items()},  # the dependency's defaults
                 "ssh_trust_cluster_name": "lab", "slurm_cluster_name": "lab", "ansible_playbook_python": sys.executable}
    return str(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))).strip()


@pytest.mark.parametrize(("role", "name", "folder", "under"), ROLE_FOLDERS)
def test_a_role_run_by_hand_uses_pycli_s_folder(monkeypatch, tmp_path, role, name, folder, under):
    monkeypatch.delenv(paths.CACHE_ENV, raising=False)
    monkeypatch.delenv(paths.STATE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _role_default(role, name) == f"{folder()}{under}" and str(folder()).startswith(str(tmp_path))


@pytest.mark.parametrize(("role", "name", "folder", "under"), ROLE_FOLDERS)
def test_a_role_run_by_pycli_uses_the_folder_pycli_passes(monkeypatch, tmp_path, role, name, folder, under):
    monkeypatch.setenv(paths.CACHE_ENV, "")  # empty: pycli's default, which pycli passes
    monkeypatch.setenv(paths.STATE_ENV, str(tmp_path / "state"))
    env = runner_env()
    assert env[paths.CACHE_ENV] == str(Path.home() / ".cache" / "pycli") and env[paths.STATE_ENV] == str(tmp_path / "state")
    for key in (paths.CACHE_ENV, paths.STATE_ENV):
        monkeypatch.setenv(key, env[key])
    assert _role_default(role, name) == f"{folder()}{under}"


def test_the_module_prints_the_folders_for_the_makefile_and_refuses_other_names(capsys):
    assert paths.main([]) == 0 and capsys.readouterr().out.split() == [f"{k}={v}" for k, v in paths.folders_env().items()]
    assert paths.main([paths.STATE_ENV]) == 0 and capsys.readouterr().out.strip() == str(paths.state_dir())
    assert paths.main(["HOME"]) == 2 and "usage: python -m pycli.core.paths" in capsys.readouterr().err


def test_no_other_file_writes_the_folders_defaults():
    """Only role controller_folders's defaults; pycli and the other roles read them."""
    defaults = re.compile(r"\.cache/pycli|\.local/state/pycli|\.cache\" / \"pycli|\.local\" / \"state\"")
    home = ROOT / "roles" / "controller_folders" / "defaults" / "main.yml"
    sources = [*ROOT.glob("pycli/**/*.py"), *ROOT.glob("roles/*/*/*.yml"), *ROOT.glob("roles/*/templates/*.j2"),
               *ROOT.glob("playbooks/*.yml"), *ROOT.glob("scripts/*"), *ROOT.glob("benchmarks/*.py"), ROOT / "Makefile"]
    assert defaults.search(home.read_text()) and len(sources) > 50
    own = home.parent.parent  # the role's spec documents its defaults
    assert [str(p.relative_to(ROOT)) for p in sources
            if own not in p.parents and p.is_file() and defaults.search(p.read_text())] == []
