"""The JSON documents pycli leaves in its run folders, and the version of each one's layout.

A reader refuses a version it does not know, in one line, rather than misread a document a
newer pycli wrote. Bump a document's version when a reader of the old layout would misread
the new one (a key renamed, removed or changing meaning); a key added needs no bump.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycli.core.errors import BadInput

VERSION_KEY = "version"


@dataclass(frozen=True)
class DocumentKind:
    file_name: str
    version: int  # the layout this pycli writes, and the only one it reads
    # What a document without the key counts as: those written before the key existed, where
    # a reader must still take them up; None where nothing reads such old documents.
    unversioned_is: int | None = None


# provision's per-host outcome; `provision --retry` reads the newest one of an inventory,
# which can be a run folder made before documents had versions.
RECAP = DocumentKind("recap.json", 1, unversioned_is=1)
# check's gates and figures (also what `check --json` prints); pycli itself reads none back.
CHECK = DocumentKind("check.json", 1)
# bench's results, rendered by pycli.bench.report as it writes them; pycli reads none back.
RESULTS = DocumentKind("results.json", 1)
# `pycli jobs --json`: Slurm's queue and its accounted jobs; printed only.
JOBS = DocumentKind("jobs.json", 1)
# `pycli top --json`: one frame of the cluster (pycli/top/model.py Frame.as_json); printed only.
TOP = DocumentKind("top.json", 1)


def versioned(kind: DocumentKind, document: Mapping[str, Any]) -> dict[str, Any]:
    """`document` with its layout's version as its first key."""
    return {VERSION_KEY: kind.version, **{key: value for key, value in document.items() if key != VERSION_KEY}}


def require_known_version(kind: DocumentKind, document: Mapping[str, Any], path: Path) -> None:
    """Nothing when `document` (read from the file `path`) has a layout this pycli reads; else
    one BadInput line naming the run folder it is in."""
    where = f"{kind.file_name} at {path.parent}"
    if VERSION_KEY not in document and kind.unversioned_is is None:
        raise BadInput(f"{where} has no version; this pycli reads version {kind.version}")
    found = document.get(VERSION_KEY, kind.unversioned_is)
    if type(found) is not int or found != kind.version:  # true and 1.0 equal 1 but are no version pycli writes
        raise BadInput(f"{where} has version {found!r}; this pycli reads version {kind.version}")


def load_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; OSError when it cannot be read, ValueError when it is no JSON object."""
    document = json.loads(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path} holds no JSON object")
    return document


def read_document(kind: DocumentKind, path: Path) -> dict[str, Any]:
    """A document pycli wrote, checked to be of a version this pycli reads (BadInput if not)."""
    document = load_json_object(path)
    require_known_version(kind, document, path)
    return document
