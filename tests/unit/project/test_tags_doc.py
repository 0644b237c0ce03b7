"""docs/tags.md has one row per tag the playbooks and roles use, and no row for a tag none uses.

The tags are read from the YAML itself (plays, their roles, imported playbooks, tasks and blocks
at any depth, and the `apply:` of an include), so a tag added to a playbook or a role without a
row here fails, naming the tag and where it is set.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

REPO = ROOT
TAGS_DOC = REPO / "docs" / "tags.md"
# Ansible gives these a meaning of its own; they select nothing a person documents.
SPECIAL_TAGS = frozenset({"always", "never", "all", "tagged", "untagged"})
TASK_LISTS = ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always")
# A row is `| `tag` | ... |` (or several tags: `| `a`, `b` | ... |`): each backticked name of the
# first cell is a tag.
FIRST_CELL = re.compile(r"^\|([^|]*)\|")
BACKTICKED = re.compile(r"`([^`]+)`")


def yaml_files() -> list[Path]:
    """The files whose tags a user can select: the playbooks and every role's tasks and handlers."""
    roles = REPO / "roles"
    return sorted(
        [*(REPO / "playbooks").glob("*.yml"), *roles.glob("*/tasks/*.yml"), *roles.glob("*/handlers/*.yml")]
    )


def tag_names(value: object) -> list[str]:
    """The tags of one `tags:` value, which Ansible takes as a list or a comma-separated string."""
    if value is None:
        return []
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    if isinstance(value, list):
        return [name for item in value for name in tag_names(item)]
    raise TypeError(f"tags: {value!r} is neither a list nor a string")


def tags_in(entry: object) -> Iterator[str]:
    """Every tag set on a play, role entry, task or block, and on what it holds."""
    if isinstance(entry, list):
        for item in entry:
            yield from tags_in(item)
        return
    if not isinstance(entry, dict):
        return
    yield from tag_names(entry.get("tags"))
    for key in TASK_LISTS:
        yield from tags_in(entry.get(key))
    for role in entry.get("roles") or []:
        if isinstance(role, dict):
            yield from tag_names(role.get("tags"))
    # include_role / include_tasks pass `apply: {tags: ...}` on to what they include.
    for key, arguments in entry.items():
        if key.split(".")[-1] in ("include_role", "include_tasks") and isinstance(arguments, dict):
            yield from tag_names((arguments.get("apply") or {}).get("tags"))


def used_tags() -> dict[str, set[str]]:
    """Each tag the playbooks and roles use, with the files (relative to the repository) that set it."""
    where: dict[str, set[str]] = {}
    for path in yaml_files():
        for tag in tags_in(yaml.load(path.read_text(), Loader=yaml.CSafeLoader)):
            if tag not in SPECIAL_TAGS:
                where.setdefault(tag, set()).add(str(path.relative_to(REPO)))
    return where


def documented_tags(markdown: str) -> list[str]:
    """The tags named in the first column of the doc's table (header and separator rows left out)."""
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    names = []
    for row in rows[2:]:
        cell = FIRST_CELL.match(row)
        names.extend(BACKTICKED.findall(cell.group(1)) if cell else [])
    return names


def test_every_tag_has_a_row_and_every_row_a_tag() -> None:
    used = used_tags()
    documented = documented_tags(TAGS_DOC.read_text())
    problems = [f"tag {tag!r} (set in {', '.join(sorted(files))}) has no row" for tag, files in sorted(used.items())
                if tag not in documented]
    problems += [f"row {tag!r} names no tag of the playbooks or roles" for tag in documented if tag not in used]
    problems += [f"tag {tag!r} has more than one row" for tag in sorted(set(documented)) if documented.count(tag) > 1]
    assert not problems, "docs/tags.md: " + "; ".join(problems)


def test_tags_are_found_in_plays_roles_blocks_and_applied_includes() -> None:
    playbook = [
        {"hosts": "nodes", "tags": "play_tag, second", "roles": [{"role": "r", "tags": ["role_tag"]}, "plain"],
         "tasks": [{"name": "outer", "tags": ["always"], "block": [{"name": "inner", "tags": ["block_tag"]}],
                    "rescue": [{"tags": "rescue_tag"}]},
                   {"ansible.builtin.include_role": {"name": "r", "apply": {"tags": ["applied"]}}},
                   {"include_tasks": {"file": "x.yml", "apply": {"tags": "applied_tasks"}}}]},
        {"ansible.builtin.import_playbook": "other.yml", "tags": ["imported"]},
    ]
    assert sorted(tags_in(playbook)) == sorted(
        ["play_tag", "second", "role_tag", "always", "block_tag", "rescue_tag", "applied", "applied_tasks", "imported"]
    )


def test_the_table_first_column_is_read_row_by_row() -> None:
    markdown = "intro with `not_a_tag`\n\n| Tag | What |\n|---|---|\n| `a` | runs `b` |\n| `c`, `d` | x |\n"
    assert documented_tags(markdown) == ["a", "c", "d"]


def test_a_tags_value_that_is_neither_list_nor_string_is_an_error() -> None:
    with pytest.raises(TypeError, match="tags: 3"):
        tag_names(3)
