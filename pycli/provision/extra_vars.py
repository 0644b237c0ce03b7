"""`-e/--extra-vars`: the variables a command passes to Ansible, read as `ansible-playbook -e` reads them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import date
from pathlib import Path

import yaml

from pycli.core.errors import BadInput, read_user_text


def parse_extra_vars(items: Sequence[str]) -> dict[str, object]:
    """The variables of `-e` options, read as `ansible-playbook -e` reads them, later ones winning.

    `key=value` gives the string as typed (`2.10` stays 2.10, never a float); `@file.yml` and an
    inline mapping (`'{"nvidia_driver_reboot": false}'`) are YAML, so they keep their types.
    Every value must survive JSON, the way ansible-runner hands variables to Ansible.
    """
    found: dict[str, object] = {}
    for item in items:
        if item.startswith("@"):
            path = Path(item[1:])
            found.update(_yaml_mapping(read_user_text(path, f"-e {item}"), f"-e {item}", str(path)))
        elif item.startswith(("{", "[")):
            found.update(_yaml_mapping(item, f"-e {item!r}", "the value"))
        else:
            key, sep, value = item.partition("=")
            if not sep or not key.isidentifier():
                raise BadInput(f"-e {item!r}: expected key=value (a variable name, '=', a value), @file.yml or a {{mapping}}")
            found[key] = value
    return found


def _yaml_mapping(text: str, label: str, what: str) -> dict[str, object]:
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"{label}: {what} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise BadInput(f"{label}: {what} must hold a mapping of variables")
    try:  # YAML dates become the text they were written as; what JSON cannot hold is refused
        variables: dict[str, object] = json.loads(json.dumps(loaded, default=_json_value))  # a dict dumped loads as one
        return variables
    except (TypeError, ValueError) as exc:
        raise BadInput(f"{label}: {exc}") from None


def _json_value(value: object) -> str:
    if isinstance(value, date):  # a datetime is a date too
        return value.isoformat()
    raise TypeError(f"a YAML {type(value).__name__} ({str(value)[:40]}) cannot be passed to Ansible; quote it")
