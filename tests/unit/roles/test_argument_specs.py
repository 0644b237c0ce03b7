"""Every role's meta/argument_specs.yml names exactly the keys of its defaults/main.yml.

A key in defaults but not in the spec escapes type checking; a key in the spec but not in
defaults is an interface nobody set a default for. Both drift silently, so this test
(after prometheus-community/ansible's lint_arguments_spec.sh) keeps them equal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

ROLES = ROOT / "roles"
ROLE_DIRS = sorted(p for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").exists())


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


# Keys whose value is one Jinja expression; elsewhere expressions sit in {{ }} or {% %}.
_CONDITION_KEYS = {"when", "that", "changed_when", "failed_when", "until"}
_JINJA = re.compile(r"\{[{%](.*?)[}%]\}", re.S)


def _bool_options() -> set[str]:
    names: set[str] = set()
    for role in ROLE_DIRS:
        for entry in (_load(role / "meta" / "argument_specs.yml")["argument_specs"] or {}).values():
            names |= {name for name, opt in (entry.get("options") or {}).items() if (opt or {}).get("type") == "bool"}
    return names


def _expressions(node: object, key: object = None):
    if isinstance(node, dict):
        for k, value in node.items():
            yield from _expressions(value, k)
    elif isinstance(node, list):
        for value in node:
            yield from _expressions(value, key)
    elif isinstance(node, str):
        if key in _CONDITION_KEYS:
            yield node
        yield from _JINJA.findall(node)


def test_switches_are_read_through_bool() -> None:
    """`-e nvidia_driver_reboot=false` is the string "false": truthy bare, an error in a bare
    `when:` (ansible-core 2.19). Every read of a bool option goes through `| bool`."""
    names = _bool_options()
    bare = re.compile(rf"\b({'|'.join(sorted(names))})\b(?!\s*(\|\s*default\([^)]*\)\s*)?\|\s*bool)")
    sources = [p for p in sorted([*ROLES.glob("*/*/*.yml"), *(ROLES.parent / "playbooks").glob("*.yml")])
               if p.parent.name not in ("defaults", "meta")]
    found = []
    for path in [*sources, *sorted(ROLES.glob("*/templates/*.j2"))]:
        text = path.read_text()
        expressions = _JINJA.findall(text) if path.suffix == ".j2" else _expressions(yaml.safe_load(text))
        for expression in expressions:
            code = re.sub(r"'[^']*'|\"[^\"]*\"", "''", expression)  # names inside string literals are prose
            found += [f"{path.relative_to(ROLES.parent)}: {m.group(1)}" for m in bare.finditer(code)]
    assert not found, "bool options read without '| bool':\n" + "\n".join(found)
