"""One grammar for every command: a flag means one thing everywhere, old names still work a release.

Walks the real typer app, so a command or option added later is held to the same rules.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
import typer
from typer.core import TyperGroup

from pycli.cli.app import app, main
from pycli.cli.options import COMMON_OPTIONS, RENAMED_FLAGS, command_path, rename_flags
from tests.conftest import ROOT

INVENTORY = "[nodes]\nn1 ansible_host=10.0.0.1 slots=2\nn2 ansible_host=10.0.0.2 slots=2\n"
# Commands that write an inventory (not read one): they must not take -i or --inventory.
WRITE_INVENTORIES = {"cluster up", "inventory new"}


def _leaves(command: object, path: str = "") -> dict[str, object]:
    if isinstance(command, TyperGroup):
        found: dict[str, object] = {}
        for name, sub in command.commands.items():
            found.update(_leaves(sub, f"{path} {name}".strip()))
        return found
    return {path: command}


COMMANDS = _leaves(typer.main.get_command(app))


def _options(command: object) -> list[tuple[list[str], list[str], object]]:
    """(long names, short names, parameter) of each option of a command, hidden ones too."""
    found = []
    for param in command.params:  # type: ignore[attr-defined]
        if param.param_type_name != "option":
            continue
        names = [*param.opts, *param.secondary_opts]
        found.append(([n for n in names if n.startswith("--")], [n for n in names if not n.startswith("--")], param))
    return found


def test_the_walk_sees_every_command():
    assert {"provision", "train", "bench", "check", "hostfile", "cluster up", "inventory new", "cache lock",
            "drain", "undrain", "fetch", "inventory show", "cluster status"} <= set(COMMANDS)


def test_no_short_flag_means_two_long_ones():
    meanings: dict[str, set[str]] = defaultdict(set)
    for command in COMMANDS.values():
        for longs, shorts, _ in _options(command):
            for short in shorts:
                meanings[short].update(longs)
    clashes = {short: sorted(longs) for short, longs in meanings.items() if len(longs) > 1}
    assert not clashes, f"a short flag names two long ones: {clashes}"


def test_common_options_have_the_same_short_name_everywhere():
    wrong = []
    for path, command in COMMANDS.items():
        for longs, shorts, _ in _options(command):
            for long in longs:
                if long in COMMON_OPTIONS and shorts != ([COMMON_OPTIONS[long]] if COMMON_OPTIONS[long] else []):
                    wrong.append(f"{path}: {long} {shorts}")
            for short in shorts:
                expected = [long for long, s in COMMON_OPTIONS.items() if s == short]
                if expected and longs != expected:
                    wrong.append(f"{path}: {short} is {longs}, not {expected}")
    assert not wrong


def test_dash_i_reads_an_inventory_and_dash_o_writes_output():
    for path, command in COMMANDS.items():
        for longs, shorts, param in _options(command):
            if "-i" in shorts or "--inventory" in longs:
                assert path not in WRITE_INVENTORIES, f"{path}: -i must read an inventory, not name one to write"
                assert longs == ["--inventory"] and shorts == ["-i"]
                assert "inventory to read" in (param.help or ""), f"{path}: {param.help}"
            if "-o" in shorts or "--output" in longs:
                assert longs == ["--output"] and shorts == ["-o"], path


def test_every_command_that_reads_an_inventory_takes_it_the_same_way():
    for path, command in COMMANDS.items():
        options = {long for longs, _, _ in _options(command) for long in longs}
        if "--inventory" not in options:
            continue
        arguments = [p for p in command.params if p.param_type_name == "argument"]  # type: ignore[attr-defined]
        named = [p for p in arguments if p.name == "inventory"]
        if path in {"drain", "undrain"}:  # their arguments are nodes
            assert not named
        elif path in {"train", "bench"}:  # the inventory may lead their free arguments (leading_inventory)
            assert not named
        else:
            assert named and named[0].metavar == "INVENTORY", path


def test_old_flag_names_are_no_option_of_their_command():
    for (path, old), new in RENAMED_FLAGS.items():
        flags = {n for longs, shorts, _ in _options(COMMANDS[path]) for n in (*longs, *shorts)}
        assert old not in flags, f"{path} still has {old} as an option of its own"
        assert new in flags, f"{path}: {old} is renamed to {new}, which it lacks"


def test_renaming_touches_flags_only_and_stops_at_the_double_dash():
    args, notices = rename_flags("train", ["--np", "2", "--backend", "mpi", "--", "--backend", "gloo"])
    assert args == ["--np", "2", "--controller", "mpi", "--", "--backend", "gloo"]
    assert notices == ["train --backend is now --controller; the old name goes after release 0.2.0 (CHANGELOG.md)"]
    assert rename_flags("hostfile", ["-fhorovod", "-o", "x"])[0] == ["--format", "horovod", "-o", "x"]
    assert rename_flags("cache lock", ["--out=locks"])[0] == ["--output", "locks"]
    assert rename_flags("provision", ["-f", "3"]) == (["-f", "3"], [])  # -f is --forks there, never renamed
    groups = {"cache": {"lock": {}, "show": {}}, "train": {}}
    assert command_path(groups, ["cache", "lock", "--python", "3.12"]) == ("cache lock", 2)
    assert command_path(groups, ["train", "cache"]) == ("train", 1)


def test_an_old_name_still_works_and_says_its_new_one(tmp_path, capsys):
    inventory = tmp_path / "a.ini"
    inventory.write_text(INVENTORY)
    assert main(["hostfile", str(inventory), "-f", "horovod"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "10.0.0.1:2,10.0.0.2:2\n"
    assert captured.err == "pycli: hostfile -f is now --format; the old name goes after release 0.2.0 (CHANGELOG.md)\n"

    written = tmp_path / "new.ini"
    assert main(["inventory", "new", "-o", str(written), "--hosts", "a,b", "--launcher", "b"]) == 0
    assert "inventory new --launcher is now --launcher-host" in capsys.readouterr().err
    assert "[launcher]\nb" in written.read_text()

    assert main(["check", str(inventory), "--backend", "nccl"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "pycli: check --backend is now --controller; the old name goes after release 0.2.0 (CHANGELOG.md)",
        "pycli: error: unknown --controller 'nccl'; use one of gloo, mpi",
    ]
    assert main(["check", str(inventory), "--controllers", "gloo,ccl"]) == 2
    assert "--build-controllers 'gloo,ccl': name one or more of gloo, mpi" in capsys.readouterr().err


def test_every_renamed_flag_is_in_the_changelog():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for (path, old), new in RENAMED_FLAGS.items():
        assert f"`{path} {old}`" in changelog and f"`{new}`" in changelog, (path, old)


# ------------------------------------------- docs/options.md's table of common options

def common_options_table() -> str:
    """docs/options.md's table: one row per command, a column per common option, from the app itself."""
    columns = list(COMMON_OPTIONS)
    header = "| command | " + " | ".join(f"`{COMMON_OPTIONS[c]}`" if COMMON_OPTIONS[c] else f"`{c}`" for c in columns) + " |"
    lines = [header, "|---|" + "---|" * len(columns)]
    for path in sorted(COMMANDS):
        params = _options(COMMANDS[path])
        longs = {long for names, _, _ in params for long in names}
        arguments = [p for p in COMMANDS[path].params if p.param_type_name == "argument"]  # type: ignore[attr-defined]
        cells = []
        for column in columns:
            if column not in longs:
                cells.append("")
            elif column == "--inventory" and (any(p.name == "inventory" for p in arguments) or path in {"train", "bench"}):
                cells.append("arg or `-i`")
            elif column == "--inventory":
                cells.append("`-i` only")
            else:
                cells.append("yes")
        lines.append(f"| `{path}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def test_the_options_doc_table_of_common_options_is_the_app_s():
    doc = (ROOT / "docs" / "options.md").read_text()
    found = re.search(r"<!-- common-options -->\n(.*?)<!-- /common-options -->", doc, re.S)
    assert found, "docs/options.md lacks the table between <!-- common-options --> and <!-- /common-options -->"
    assert found.group(1) == common_options_table(), "docs/options.md's table is stale; it should read:\n" + common_options_table()


@pytest.mark.parametrize("path", ["drain", "undrain"])
def test_drain_help_names_no_argument_it_lacks(path):
    for longs, _, param in _options(COMMANDS[path]):
        if "--inventory" in longs:
            assert "argument" not in (param.help or "")
