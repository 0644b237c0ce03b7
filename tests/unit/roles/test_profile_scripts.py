"""The profile.d scripts the roles write: a path from the inventory stays one value, never code.

Rendered with Jinja2 as Ansible renders them (Ansible's `quote` filter is shlex.quote), then
checked by the shells that read them on a node: bash (bash.bashrc, login shells) and sh."""

import shlex
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from tests.conftest import ROOT


def render(template: str, **variables: str) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    return env.from_string(template).render(ansible_managed="Ansible managed", **variables)


def openmpi_script(prefix: str) -> str:
    template = (ROOT / "roles/openmpi/templates/openmpi.sh.j2").read_text()
    return render(template, openmpi_version="4.1.8", openmpi_prefix=prefix)


def venv_script(venv: str) -> str:
    tasks = yaml.safe_load((ROOT / "roles/common/tasks/configure.yml").read_text())
    (task,) = [t for t in tasks if t.get("ansible.builtin.copy", {}).get("dest") == "/etc/profile.d/pycli-venv.sh"]
    return render(task["ansible.builtin.copy"]["content"], common_venv_path=venv)


def hostile(tmp_path: Path) -> list[str]:
    """Folders that run a command, or end the script, if their name reaches the shell unquoted."""
    pwned = tmp_path / "pwned"
    return [
        f"/opt/mpi $(touch {pwned})",
        f"/opt/mpi`touch {pwned}`",
        f"/opt/it's; touch {pwned}; :",
        f"/opt/mpi\ntouch {pwned}\n",
        '/opt/"quoted" dir',
    ]


def source(script: str, shell: str, tmp_path: Path) -> list[str]:
    """PATH and LD_LIBRARY_PATH after `shell` sources the script twice (a login shell, then bash.bashrc)."""
    path = tmp_path / "profile.sh"
    path.write_text(script)
    assert subprocess.run([shell, "-n", str(path)], capture_output=True).returncode == 0
    run = subprocess.run([shell, "-c", '. "$1"; . "$1"; printf "%s\\0" "$PATH" "${LD_LIBRARY_PATH-}"', shell, str(path)],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert run.returncode == 0, run.stderr
    return run.stdout.split("\0")[:2]


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_openmpi_prefix_is_one_value_in_path_and_library_path(tmp_path, shell):
    for prefix in hostile(tmp_path):
        path, library_path = source(openmpi_script(prefix), shell, tmp_path)
        assert path == f"{prefix}/bin:/usr/bin:/bin"  # once, though sourced twice
        assert library_path == f"{prefix}/lib"
        assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_venv_path_is_one_value_in_path(tmp_path, shell):
    for venv in hostile(tmp_path):
        path, _ = source(venv_script(venv), shell, tmp_path)
        assert path == f"{venv}/bin:/usr/bin:/bin"
        assert not (tmp_path / "pwned").exists()

