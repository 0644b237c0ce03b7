"""Every role's meta/argument_specs.yml names exactly the keys of its defaults/main.yml.

A key in defaults but not in the spec escapes type checking; a key in the spec but not in
defaults is an interface nobody set a default for. Both drift silently, so this test
(after prometheus-community/ansible's lint_arguments_spec.sh) keeps them equal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
ROLE_DIRS = sorted(p for p in ROLES.iterdir() if (p / "tasks" / "main.yml").exists())


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLE_DIRS, ids=[p.name for p in ROLE_DIRS])
def test_argument_specs_match_defaults(role: Path) -> None:
    defaults_file = role / "defaults" / "main.yml"
    spec_file = role / "meta" / "argument_specs.yml"
    defaults = set(_load(defaults_file)) if defaults_file.exists() else set()
    assert spec_file.exists(), f"{role.name}: meta/argument_specs.yml is missing"
    options = set(_load(spec_file)["argument_specs"]["main"].get("options") or {})
    assert not defaults - options, f"{role.name}: in defaults/main.yml, not in argument_specs: {sorted(defaults - options)}"
    assert not options - defaults, f"{role.name}: in argument_specs, not in defaults/main.yml: {sorted(options - defaults)}"


@pytest.mark.parametrize("role", ROLE_DIRS, ids=[p.name for p in ROLE_DIRS])
def test_public_variables_carry_the_role_prefix(role: Path) -> None:
    defaults_file = role / "defaults" / "main.yml"
    if not defaults_file.exists():
        pytest.skip("no defaults")
    unprefixed = [k for k in _load(defaults_file) if not k.startswith(f"{role.name}_")]
    assert not unprefixed, f"{role.name}: public variables without the '{role.name}_' prefix: {unprefixed}"


@pytest.mark.parametrize("role", ROLE_DIRS, ids=[p.name for p in ROLE_DIRS])
def test_every_option_is_described(role: Path) -> None:
    spec = _load(role / "meta" / "argument_specs.yml")["argument_specs"]["main"].get("options") or {}
    undocumented = [k for k, v in spec.items() if not (v or {}).get("description")]
    assert not undocumented, f"{role.name}: options without a description: {undocumented}"
