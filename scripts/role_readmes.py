"""Write the Role Variables table of every roles/*/README.md from the role's own interface.

Each variable is described once, in the role's meta/argument_specs.yml; its default is read
from defaults/main.yml. The table sits between two marker comments under `## Role Variables`;
everything else in a README is prose a person writes. Every README has the same sections, in
this order: Requirements, Role Variables, Dependencies, Example Playbook.

    .venv/bin/python scripts/role_readmes.py          # rewrite the tables
    .venv/bin/python scripts/role_readmes.py --check  # exit 1 naming each README out of date

Exit codes: 0 up to date (or rewritten), 1 a role has no README, or one is out of date or
not in the shape above.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

ROLES = Path(__file__).resolve().parents[1] / "roles"
BEGIN = "<!-- variables: generated from meta/argument_specs.yml by scripts/role_readmes.py; edit there -->"
END = "<!-- end variables -->"
SECTIONS = ("Requirements", "Role Variables", "Dependencies", "Example Playbook")
REGENERATE = ".venv/bin/python scripts/role_readmes.py"
# The line above every table: where a reader finds the rest (types, choices, the long comments).
INTRO = "Defaults from `defaults/main.yml`, where each variable is commented; types and choices in `meta/argument_specs.yml`."


def table_cell(text: str) -> str:
    """Text on one line, its pipes escaped so they do not split the Markdown table row."""
    return " ".join(text.split()).replace("|", "\\|")


def code_cell(text: str) -> str:
    """Text in a code span that survives backticks inside it; pipes escaped (GitHub reads `\\|` as `|` there)."""
    text = table_cell(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    padding = " " if longest else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def default_text(value: object) -> str:
    """A default as a person would type it in YAML: strings bare, lists and mappings in flow style."""
    if isinstance(value, str):
        return value if value.strip() else '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return str(value)
    dumped = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1_000_000)
    return dumped.strip().removesuffix("...").strip()


def description_text(spec: Mapping[str, object]) -> str:
    """The spec's description; Ansible allows a list of paragraphs too."""
    description = spec.get("description") or ""
    if isinstance(description, list):
        return " ".join(str(part) for part in description)
    return str(description)


def variables_table(options: Mapping[str, Mapping[str, object]], defaults: Mapping[str, object]) -> str:
    """The Markdown table: one row per option of the spec, in the spec's order."""
    rows = ["| Variable | Default | Description |", "|---|---|---|"]
    for name, spec in options.items():
        spec = spec or {}
        if name in defaults:
            default = code_cell(default_text(defaults[name]))
        elif spec.get("required"):
            default = "required"
        else:
            default = "unset"
        rows.append(f"| {code_cell(name)} | {default} | {table_cell(description_text(spec))} |")
    return "\n".join(rows) + "\n"


def _load(path: Path) -> dict:
    return (yaml.safe_load(path.read_text()) if path.exists() else None) or {}


def role_table(role: Path) -> str:
    spec = _load(role / "meta" / "argument_specs.yml").get("argument_specs", {}).get("main", {})
    return variables_table(spec.get("options") or {}, _load(role / "defaults" / "main.yml"))


def shape_problems(text: str, role: str) -> list[str]:
    """Why the README does not have the one shape every role README has; empty when it does."""
    problems = []
    if not text.startswith(f"# {role}\n"):
        problems.append(f"it must start with the title '# {role}'")
    headings = tuple(re.findall(r"^## (.+?)\s*$", text, flags=re.MULTILINE))
    if headings != SECTIONS:
        problems.append(f"its sections must be {', '.join(SECTIONS)} in that order, found {', '.join(headings) or 'none'}")
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        problems.append(f"it has no generated table: put the lines {BEGIN} and {END} under '## Role Variables'")
    elif re.findall(r"^## (.+?)\s*$", text[:begin], flags=re.MULTILINE)[-1:] != ["Role Variables"]:
        problems.append("its generated table must sit under '## Role Variables'")
    return problems


def with_table(text: str, table: str) -> str:
    """The README with the part between the markers replaced by `table`."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{INTRO}\n\n{table}{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each README out of date")
    parser.add_argument("--roles", type=Path, default=ROLES, help="folder of roles (default: this repository's)")
    args = parser.parse_args(argv)
    failed = False
    for role in sorted(path.parent.parent for path in args.roles.glob("*/meta/argument_specs.yml")):
        readme = role / "README.md"
        shown = readme.relative_to(args.roles.parent)
        if not readme.exists():
            print(f"{shown} is missing; every role has one (see roles/docker/README.md for the shape)", file=sys.stderr)
            failed = True
            continue
        text = readme.read_text()
        if problems := shape_problems(text, role.name):
            for problem in problems:
                print(f"{shown}: {problem}", file=sys.stderr)
            failed = True
            continue
        wanted = with_table(text, role_table(role))
        if wanted == text:
            continue
        if args.check:
            print(f"{shown} is out of date: its Role Variables table differs from meta/argument_specs.yml "
                  f"and defaults/main.yml; run {REGENERATE}", file=sys.stderr)
            failed = True
        else:
            readme.write_text(wanted)
            print(f"rewrote {shown}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
