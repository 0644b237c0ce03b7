"""The `pycli` command line: argument parsing only; the work happens in the modules it calls."""

from __future__ import annotations

import sys
from typing import TypeAlias

import typer
from typer._click import exceptions as click_errors  # typer vendors click since 0.20
from typer.core import TyperGroup

from pycli import __version__
from pycli.cli.bench import bench_cmd
from pycli.cli.cache import cache_app, fetch_cmd
from pycli.cli.check import check_cmd
from pycli.cli.cluster import cluster_app
from pycli.cli.drain import drain_cmd, undrain_cmd
from pycli.cli.inventory import hostfile_cmd, inventory_app
from pycli.cli.jobs import jobs_cmd
from pycli.cli.options import INVENTORY_RULE, command_path, rename_flags
from pycli.cli.provision import provision_cmd
from pycli.cli.top import top_cmd
from pycli.cli.train import train_cmd
from pycli.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, PycliError, notice
from pycli.core.tree import PROJECT_ROOT, host_prereqs_command

app = typer.Typer(
    name="pycli",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(cluster_app, name="cluster")
app.add_typer(inventory_app, name="inventory")
app.command("hostfile")(hostfile_cmd)
app.command("fetch")(fetch_cmd)
app.add_typer(cache_app, name="cache")
app.command("provision")(provision_cmd)
app.command("train")(train_cmd)
app.command("bench")(bench_cmd)
app.command("check")(check_cmd)
app.command("drain")(drain_cmd)
app.command("undrain")(undrain_cmd)
app.command("jobs")(jobs_cmd)
app.command("top")(top_cmd)


def _version(value: bool) -> None:
    if value:
        print(f"pycli {__version__}\nroles, playbooks and workloads: {PROJECT_ROOT}\n"
              f"this machine's set-up for a local cluster: {host_prereqs_command()}")
        raise typer.Exit()


@app.callback(help=f"Provision GPU training clusters with Ansible and run distributed PyTorch jobs on them.\n\n{INVENTORY_RULE}")
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass


# A command's subcommands: each one's name -> its own subcommands (a leaf: {}).
Subcommands: TypeAlias = "dict[str, Subcommands]"


def _subcommands(command: object) -> Subcommands:
    """Each subcommand's name -> its own subcommands (a leaf: {})."""
    if not isinstance(command, TyperGroup):
        return {}
    return {name: _subcommands(sub) for name, sub in command.commands.items()}


def _fail(message: str, code: int) -> int:
    print(f"pycli: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every error the user can cause ends as one line on stderr and an exit code."""
    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    path, words = command_path(_subcommands(command), args)
    rest, notices = rename_flags(path, args[words:])
    for line in notices:
        notice(line)
    try:
        result = command.main(args=[*args[:words], *rest], prog_name="pycli", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else "", file=sys.stderr)
        return EXIT_BAD_INPUT
    except click_errors.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        return _fail(exc.format_message().replace("\n", " ") + where, EXIT_BAD_INPUT)
    except click_errors.ClickException as exc:
        return _fail(exc.format_message().replace("\n", " "), exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        return _fail("interrupted", EXIT_INTERRUPTED)
    except PycliError as exc:
        return _fail(str(exc), exc.exit_code)
    except OSError as exc:
        return _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), EXIT_FAILED)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
