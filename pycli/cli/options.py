"""The options every command shares, the one rule for finding the inventory, and renamed flags.

A flag means one thing in every command (as kayobe's `add_args` gives each command the same
`-i/-e/-l/-t`): the commands take their common options from `COMMON_OPTIONS` below, and
tests/unit/cli/test_options.py walks the app and fails when a short flag names two long ones.

The inventory rule: a command that reads an inventory takes it as its first argument or with
`-i/--inventory` (drain and undrain: `-i` only, their arguments are nodes); given neither, it
uses the local cluster that is up, when exactly one is, and says so on stderr.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import typer

from pycli.cluster.model import Cluster
from pycli.core.errors import NEXT_RELEASE, BadInput, notice, renamed_line

INVENTORY_RULE = (
    "Commands that read an inventory take it as their first argument or with -i INVENTORY (drain and "
    "undrain: -i only); given neither, they use the local cluster that is up ('pycli cluster up'), "
    "when exactly one is."
)

# Long name -> short name (None: no short one) of the options several commands share. Each
# means the same everywhere: -i reads an inventory, -o writes the command's output, -l/-t/-e/-f
# are ansible-playbook's, --json prints JSON on stdout, -v shows more.
COMMON_OPTIONS: Mapping[str, str | None] = {
    "--inventory": "-i",
    "--output": "-o",
    "--limit": "-l",
    "--tags": "-t",
    "--extra-vars": "-e",
    "--forks": "-f",
    "--json": None,
    "--verbose": "-v",
}

INVENTORY_HELP = "Inventory of the cluster (INI, YAML or a folder), or -i INVENTORY. Default: the local cluster that is up."
INVENTORY_ARGUMENT = typer.Argument(None, help=INVENTORY_HELP, show_default=False, metavar="INVENTORY")
INVENTORY_OPTION = typer.Option(
    None, "--inventory", "-i", help="The inventory to read, or as the first argument. Default: the local cluster that is up."
)
# drain and undrain: their arguments are nodes, so the inventory comes only this way.
INVENTORY_ONLY_OPTION = typer.Option(
    None, "--inventory", "-i", help="The inventory to read. Default: the local cluster that is up."
)
LIMIT_OPTION = typer.Option(None, "--limit", "-l", help="Only these hosts (an Ansible pattern).")
TAGS_OPTION = typer.Option(None, "--tags", "-t", help="Only these roles/steps (see docs/tags.md).")
EXTRA_VARS_OPTION = typer.Option([], "--extra-vars", "-e", help="key=value or @vars.yml, as ansible-playbook -e; repeatable.")
JSON_OPTION = typer.Option(False, "--json", help="Print JSON on stdout (for scripts).")
VERBOSE_OPTION = typer.Option(0, "--verbose", "-v", count=True, help="Show Ansible's own output (-vv, -vvv: more).")


def forks_option() -> Any:
    from pycli.cluster.runner import FORKS_DEFAULT_HELP

    return typer.Option(None, "--forks", "-f", help=f"Hosts worked on at once (default: {FORKS_DEFAULT_HELP}).")


def output_option(help: str, default: Any = None, **kwargs: Any) -> Any:
    """-o/--output: where a command writes what it makes (the one meaning of -o)."""
    return typer.Option(default, "--output", "-o", help=help, **kwargs)


# --------------------------------------------------------------- renamed flags

# (command, old flag) -> its new name, under the last release that takes the old name: the release
# the rename came in. Each use prints a one-line notice (CHANGELOG.md); they are rewritten before
# the command is parsed, so no command carries a second, hidden meaning of a flag.
RENAMED_FLAGS_BY_RELEASE: Mapping[str, Mapping[tuple[str, str], str]] = {"0.2.0": {
    ("hostfile", "-f"): "--format",
    ("cache lock", "--out"): "--output",
    ("cluster up", "--inventory"): "--output",
    ("cluster up", "-i"): "--output",
    ("inventory new", "--launcher"): "--launcher-host",
    ("bench", "--np"): "--np-list",
    ("check", "--controllers"): "--build-controllers",
    ("check", "--backend"): "--controller",
    ("train", "--backend"): "--controller",
}, NEXT_RELEASE: {
    # --timeout is how long something has to answer (top); a job's wall-clock limit is its own word.
    ("train", "--timeout"): "--time-limit",
}}
RENAMED_FLAGS: Mapping[tuple[str, str], str] = {
    flag: new for renamed in RENAMED_FLAGS_BY_RELEASE.values() for flag, new in renamed.items()
}
GOES_AFTER: Mapping[tuple[str, str], str] = {
    flag: release for release, renamed in RENAMED_FLAGS_BY_RELEASE.items() for flag in renamed
}


def command_path(groups: Mapping[str, Any], argv: Sequence[str]) -> tuple[str, int]:
    """The subcommand words at the front of argv ("cache lock") and how many there are.

    `groups` maps a command's name to its subcommands' mapping (a leaf maps to {}).
    """
    words: list[str] = []
    level = groups
    for word in argv:
        if word not in level:
            break
        words.append(word)
        level = level[word]
    return " ".join(words), len(words)


def rename_flags(command: str, args: Sequence[str]) -> tuple[list[str], list[str]]:
    """`args` with the command's old flag names put as the new ones, and a notice per old name used.

    Only flags are touched: nothing after `--` (a workload's own arguments), and an old short
    flag also when its value is joined to it (`-fhorovod`), a long one also as `--out=DIR`.
    """
    renamed = {old: new for (cmd, old), new in RENAMED_FLAGS.items() if cmd == command}
    result: list[str] = []
    notices: list[str] = []
    for position, arg in enumerate(args):
        if arg == "--":
            result.extend(args[position:])
            break
        new, rest = _renamed(arg, renamed)
        if new is None:
            result.append(arg)
            continue
        old = arg[: len(arg) - len(rest)].rstrip("=")
        result.extend([new, rest] if rest else [new])
        line = renamed_line(f"{command} {old}", new, GOES_AFTER[command, old])
        if line not in notices:
            notices.append(line)
    return result, notices


def _renamed(arg: str, renamed: Mapping[str, str]) -> tuple[str | None, str]:
    if arg in renamed:
        return renamed[arg], ""
    for old, new in renamed.items():
        if old.startswith("--") and arg.startswith(old + "="):
            return new, arg[len(old) + 1:]
        if not old.startswith("--") and len(old) == 2 and arg.startswith(old) and len(arg) > 2 and not arg.startswith("--"):
            return new, arg[2:]
    return None, ""


# ------------------------------------------------------------------ inventory


def given_inventory(argument: Path | None, option: Path | None) -> Path | None:
    """The inventory named as the argument or with -i; both given must name the same file or folder."""
    if argument is not None and option is not None and argument.resolve() != option.resolve():
        raise BadInput(f"two inventories given, {argument} and -i {option}; give one, as the argument or with -i")
    return argument if argument is not None else option


def leading_inventory(
    arguments: Sequence[str], workloads: Sequence[str] = (), *, option_given: bool = False
) -> tuple[Path | None, list[str]]:
    """An inventory given first among `train`'s or `bench`'s free arguments, and the arguments after it.

    By the word, never by what the filesystem holds: the first argument is the inventory unless
    it is an option's (starts with '-'), a Python script (ends in .py) or one of `workloads` (the
    built-in workload names). Whether it exists decides only which one-line error comes: taken so
    and missing, the line says the rule; but with the inventory given by -i (`option_given`) it
    is the workload, for the workload's own check to name (`train resnet50 -i cluster.ini`:
    unknown workload).
    """
    if not arguments:
        return None, []
    first = arguments[0]
    if first.startswith("-") or first.endswith(".py") or first in workloads:
        return None, list(arguments)
    if not Path(first).exists():
        if option_given and workloads:
            return None, list(arguments)
        named = f"a workload ({', '.join(workloads)} or a .py script) or " if workloads else ""
        raise BadInput(f"{first}: no such inventory; the first argument is {named}an inventory, and the workload's "
                       "own arguments come after '--'")
    return Path(first), list(arguments[1:])


def resolve_inventory(inventory: Path | None) -> Path:
    """The inventory given, else the one local cluster that is up (said on stderr)."""
    if inventory is not None:
        return inventory
    from pycli.local import cluster as local_cluster

    running = local_cluster.running_clusters()
    if len(running) == 1:
        name, path = next(iter(running.items()))
        notice(f"inventory {path}: the local cluster '{name}', the one that is up")
        return path
    if not running:
        raise BadInput("no inventory given and no local cluster is up: name one (first argument or -i INVENTORY), "
                       "or run 'pycli cluster up'")
    raise BadInput(f"no inventory given and {len(running)} local clusters are up ({', '.join(sorted(running))}): "
                   "name one (first argument or -i INVENTORY)")


def load_inventory(argument: Path | None, option: Path | None = None) -> Cluster:
    """The cluster of the inventory given (as the argument or with -i), else of the one local
    cluster that is up, read and checked once, with its drained list (pycli/cluster/drained.py)."""
    from pycli.cluster.drained import with_drained
    from pycli.cluster.model import load_cluster

    return with_drained(load_cluster(resolve_inventory(given_inventory(argument, option))))
