"""Role common and /etc/pip.conf: it sets the one key it owns and leaves the user's own settings.

The role's own task arguments run here through Ansible's module on a temporary file (the
module is what a node runs), so what is checked is what the role does, changed status included."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = Path(sys.executable).with_name("ansible")
PIP_CONF = "/etc/pip.conf"
USERS_OWN = "[global]\nindex-url = https://mirror.example/simple\ntimeout = 60\n\n[install]\nno-compile = true\n"


def pip_conf_tasks() -> list[dict]:
    tasks = yaml.safe_load((ROOT / "roles/common/tasks/configure.yml").read_text())
    return [t for t in tasks if PIP_CONF in json.dumps(t)]


def run_task_on(path: Path, tmp_path: Path) -> tuple[bool, str]:
    """Run the role's pip.conf task against `path` on this machine: (changed, the file after)."""
    (task,) = pip_conf_tasks()
    # Only a module whose path is the one to change: never one that would write this machine's /etc.
    assert set(task) & {"community.general.ini_file"}, task
    args = {**task["community.general.ini_file"], "path": str(path)}
    module = "community.general.ini_file"
    proc = subprocess.run(
        [str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
         "-m", module, "-a", json.dumps(args)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.startswith("localhost | CHANGED"), path.read_text()


def test_only_one_task_touches_pip_conf_and_it_sets_keys_not_the_whole_file():
    (task,) = pip_conf_tasks()
    assert "community.general.ini_file" in task, "pip.conf is the user's file too: set keys, never replace it"
    args = task["community.general.ini_file"]
    assert (args["section"], args["option"]) == ("global", "cert")


def test_the_users_settings_survive_and_a_second_run_changes_nothing(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text(USERS_OWN)
    changed, text = run_task_on(conf, tmp_path)
    assert changed
    for line in ("index-url = https://mirror.example/simple", "timeout = 60", "[install]", "no-compile = true"):
        assert line in text
    assert "cert = /etc/ssl/certs/ca-certificates.crt" in text
    assert run_task_on(conf, tmp_path) == (False, text)


def test_a_different_cert_is_put_back_and_a_missing_file_is_made(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\ncert = /somewhere/else.pem\nindex-url = https://mirror.example/simple\n")
    changed, text = run_task_on(conf, tmp_path)
    assert changed and "/somewhere/else.pem" not in text and "index-url = https://mirror.example/simple" in text
    fresh = tmp_path / "fresh.conf"
    changed, text = run_task_on(fresh, tmp_path)
    assert changed and text.split() == ["[global]", "cert", "=", "/etc/ssl/certs/ca-certificates.crt"]
    assert (fresh.stat().st_mode & 0o777) == 0o644
