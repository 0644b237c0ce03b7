"""The errors a user sees: one line each, with the exit code the design names.

Exit codes: 0 ok, 1 failed task or job, 2 bad input, 4 unreachable hosts, 130 interrupted
(Ctrl-C, as a shell reports a process ended by SIGINT). Every module takes them from here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130


class PycliError(Exception):
    """An error worth one line to the user; never shown as a traceback."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(PycliError):
    """The user's input (arguments, files, environment) cannot work as given."""

    exit_code = EXIT_BAD_INPUT


class Unreachable(PycliError):
    """Some hosts could not be reached."""

    exit_code = EXIT_UNREACHABLE


@dataclass(frozen=True)
class Located:
    """A problem at a known place (file:line[:column]), shown there rather than at the source."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def problems_error(source: str, problems: Iterable[str | Located]) -> BadInput:
    """One BadInput for many problems: one line each, every line standing alone."""
    return BadInput("\n".join(str(p) if isinstance(p, Located) else f"{source}: {p}" for p in problems))


def notice(message: str) -> None:
    """A line for the user that is no part of a command's output (a hostfile on stdout stays a
    hostfile): every notice and warning of every command goes to stderr through here."""
    print(f"pycli: {message}", file=sys.stderr)


# What a user typed before a rename keeps working for one release: the one a rename comes in, the
# next one for what CHANGELOG.md's "Unreleased" renames.
NEXT_RELEASE = "0.3.0"


def renamed_line(old: str, new: str, goes_after: str = NEXT_RELEASE) -> str:
    """The one notice for an old name or meaning still taken: what it is now, and until when."""
    return f"{old} is now {new}; the old name goes after release {goes_after} (CHANGELOG.md)"


def warn(message: str) -> None:
    """Something the user should know that does not stop the command: one line on stderr."""
    notice(f"warning: {message}")


def text_of(data: bytes, label: str) -> str:
    """`data` as UTF-8 text; BadInput naming `label` (the option or file as the user gave it) if it is not."""
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise BadInput(f"{label}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def read_user_text(path: Path, label: str) -> str:
    """The text of a file the user named; one BadInput line when it cannot be read or is not text."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{label}: cannot read it ({exc.strerror or exc})") from None
    return text_of(data, label)
