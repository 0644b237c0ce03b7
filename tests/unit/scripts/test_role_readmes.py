"""Role READMEs: one shape, and a Role Variables table that matches the role's interface.

The tables are written by scripts/role_readmes.py from meta/argument_specs.yml and
defaults/main.yml; a README left behind after a spec or default changed fails here.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("role_readmes", ROOT / "scripts" / "role_readmes.py")
role_readmes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(role_readmes)


def test_every_role_readme_is_up_to_date(capsys):
    code = role_readmes.main(["--check"])
    assert code == 0, f"stale role READMEs; run .venv/bin/python scripts/role_readmes.py:\n{capsys.readouterr().err}"


def test_the_table_shows_defaults_as_yaml_in_code_with_pipes_escaped():
    options = {
        "demo_url": {"type": "str", "description": "Where | from."},
        "demo_packages": {"type": "list", "description": ["Packages,", "in  order."]},
        "demo_flag": {"type": "bool", "description": "A switch."},
        "demo_empty": {"type": "str", "description": "Nothing."},
        "demo_tick": {"type": "str", "description": "Backticks."},
        "demo_must": {"type": "str", "required": True, "description": "No default."},
    }
    defaults = {
        "demo_url": "{{ base | default('x') }}\n  /gpg",
        "demo_packages": ["a", "b"],
        "demo_flag": True,
        "demo_empty": "",
        "demo_tick": "a`b",
    }
    assert role_readmes.variables_table(options, defaults).splitlines() == [
        "| Variable | Default | Description |",
        "|---|---|---|",
        "| `demo_url` | `{{ base \\| default('x') }} /gpg` | Where \\| from. |",
        "| `demo_packages` | `[a, b]` | Packages, in order. |",
        "| `demo_flag` | `true` | A switch. |",
        '| `demo_empty` | `""` | Nothing. |',
        "| `demo_tick` | `` a`b `` | Backticks. |",
        "| `demo_must` | required | No default. |",
    ]


def _copy_role(tmp_path: Path, name: str = "docker") -> Path:
    roles = tmp_path / "roles"
    shutil.copytree(ROOT / "roles" / name, roles / name)
    return roles


def test_check_names_the_stale_readme_and_a_rewrite_brings_it_up_to_date(tmp_path, capsys):
    roles = _copy_role(tmp_path)
    defaults = roles / "docker" / "defaults" / "main.yml"
    defaults.write_text(defaults.read_text().replace("docker_default_shm_size: 1G", "docker_default_shm_size: 2G"))
    assert role_readmes.main(["--check", "--roles", str(roles)]) == 1
    err = capsys.readouterr().err
    assert "roles/docker/README.md is out of date" in err and err.count("\n") == 1
    assert role_readmes.main(["--roles", str(roles)]) == 0
    assert "| `docker_default_shm_size` | `2G` |" in (roles / "docker" / "README.md").read_text()
    assert role_readmes.main(["--check", "--roles", str(roles)]) == 0


def test_a_readme_without_the_sections_or_markers_is_refused(tmp_path, capsys):
    roles = _copy_role(tmp_path)
    readme = roles / "docker" / "README.md"
    readme.write_text("# docker\n\nSummary.\n\n## Role Variables\n\nSee defaults.\n")
    before = readme.read_text()
    assert role_readmes.main(["--roles", str(roles)]) == 1
    err = capsys.readouterr().err
    assert "roles/docker/README.md: its sections must be Requirements, Role Variables, Dependencies, Example Playbook" in err
    assert "roles/docker/README.md: it has no generated table" in err
    assert readme.read_text() == before


def test_a_role_without_a_readme_is_named(tmp_path, capsys):
    roles = _copy_role(tmp_path)
    (roles / "docker" / "README.md").unlink()
    assert role_readmes.main(["--check", "--roles", str(roles)]) == 1
    assert "roles/docker/README.md is missing" in capsys.readouterr().err
