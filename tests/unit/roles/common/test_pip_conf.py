"""Role common and /etc/pip.conf: it sets the one key it owns and leaves the user's own settings.

The role's own task runs here through Ansible on a temporary file instead of /etc/pip.conf,
so what is checked is what the role does, changed status included."""

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_tasks_locally

PIP_CONF = "/etc/pip.conf"
USERS_OWN = "[global]\nindex-url = https://mirror.example/simple\ntimeout = 60\n\n[install]\nno-compile = true\n"


def pip_conf_tasks() -> list[dict]:
    tasks = yaml.safe_load((ROOT / "roles/common/tasks/configure.yml").read_text())
    return [t for t in tasks if PIP_CONF in json.dumps(t)]


def run_task_on(path: Path, tmp_path: Path) -> tuple[bool, str]:
    """Run the role's pip.conf task against `path` on this machine: (changed, the file after)."""
    (task,) = pip_conf_tasks()
    # Only a module whose path is the one to change: never one that would write this machine's /etc.
    assert "community.general.ini_file" in task, task
    task = {**task, "community.general.ini_file": {**task["community.general.ini_file"], "path": str(path)}}
    (result,) = run_tasks_locally([task], {}, tmp_path)
    assert not result.get("failed"), result
    return result["changed"], path.read_text()


def test_only_one_task_touches_pip_conf_and_it_sets_keys_not_the_whole_file():
    (task,) = pip_conf_tasks()
    assert "community.general.ini_file" in task, "pip.conf is the user's file too: set keys, never replace it"
    args = task["community.general.ini_file"]
    assert (args["section"], args["option"]) == ("global", "cert")


@pytest.mark.slow_ansible
def test_the_users_settings_survive_and_a_second_run_changes_nothing(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text(USERS_OWN)
    changed, text = run_task_on(conf, tmp_path)
    assert changed
    for line in ("index-url = https://mirror.example/simple", "timeout = 60", "[install]", "no-compile = true"):
        assert line in text
    assert "cert = /etc/ssl/certs/ca-certificates.crt" in text
    assert run_task_on(conf, tmp_path) == (False, text)


@pytest.mark.slow_ansible
def test_a_different_cert_is_put_back_and_a_missing_file_is_made(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\ncert = /somewhere/else.pem\nindex-url = https://mirror.example/simple\n")
    changed, text = run_task_on(conf, tmp_path)
    assert changed and "/somewhere/else.pem" not in text and "index-url = https://mirror.example/simple" in text
    fresh = tmp_path / "fresh.conf"
    changed, text = run_task_on(fresh, tmp_path)
    assert changed and text.split() == ["[global]", "cert", "=", "/etc/ssl/certs/ca-certificates.crt"]
    assert (fresh.stat().st_mode & 0o777) == 0o644
