"""The controller cache as a thing of its own: wheelhouse locks, export and import.

The cache (`$PYCLI_CACHE`, else its default in pycli.core.paths.cache_dir) holds what the roles install:
`downloads/` (source tarballs, each checked against a pinned sha256), `wheelhouse/<key>/`
(one per node Python and platform, filled from a lock that pins every wheel by sha256, and
beside it `<key>.tar`, the same wheels as the one archive nodes get) and
`artifacts/` (Open MPI and Horovod built once, each beside a `.sha256`). The cache stage
(playbooks/cache.yml, `pycli fetch`) fills it; `export` and `import` carry a filled cache to
a controller with no internet, where `pycli provision --offline` downloads nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

import yaml

from pycli.core.errors import BadInput, Located, PycliError, read_user_text
from pycli.core.paths import cache_dir
from pycli.core.tree import PROJECT_ROOT

# What a filled cache holds and an export carries (the node image's package cache and the
# generated data sets are made again wherever they are needed).
CARRIED = ("downloads", "wheelhouse", "artifacts")
MANIFEST = "MANIFEST.sha256"
# The horovod role reads its locks and platforms from here; so does `pycli cache lock`.
HOROVOD_ROLE = PROJECT_ROOT / "roles" / "horovod"
LOCKS_DIR = HOROVOD_ROLE / "files" / "wheelhouse"
REQUIREMENTS_IN = LOCKS_DIR / "requirements.in"
_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_sha256_lines(
    text: str, source: str, name_ok: Callable[[str], bool] = lambda name: name.strip() != "", expected: str = "<sha256>  <name>"
) -> dict[str, str]:
    """sha256sum's `<sha256>  <name>` lines as {name: sha256}; the first line that is not one
    (or names what `name_ok` refuses) is BadInput at `source`:line."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not (sep and re.fullmatch(r"[0-9a-f]{64}", digest) and name_ok(name)):
            raise BadInput(str(Located(f"{source}:{number}", f"not a '{expected}' line")))
        found[name] = digest
    return found


# --- wheelhouse locks ----------------------------------------------------------------------


def wheel_platforms() -> dict[str, list[str]]:
    """The wheel platforms the horovod role downloads for each node architecture."""
    found = yaml.safe_load((HOROVOD_ROLE / "vars" / "main.yml").read_text())["__horovod_wheel_platforms"]
    return {str(arch): [str(p) for p in platforms] for arch, platforms in found.items()}


def parse_python(text: str) -> str:
    """'3.11' -> '311' (the cpython tag digits); anything else is bad input."""
    match = re.fullmatch(r"3\.(\d{1,2})", text.strip())
    if not match:
        raise BadInput(f"--python {text!r}: give the nodes' Python as MAJOR.MINOR, e.g. 3.11")
    return f"3{match.group(1)}"


def lock_name(pyver: str, arch: str) -> str:
    return f"cp{pyver}-{arch}.txt"


def wheel_pin(filename: str) -> tuple[str, str]:
    """(normalised name, version) of a wheel file name (PEP 427)."""
    match = _WHEEL_NAME.match(filename)
    if not match:
        raise PycliError(f"{filename} is not a wheel file name")
    return re.sub(r"[-_.]+", "-", match["name"]).lower(), match["version"]


def render_lock(pins: list[tuple[str, str, str]], header: list[str]) -> str:
    """pip's --require-hashes format, one pinned wheel a line, sorted by name."""
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [f"{name}=={version} --hash=sha256:{digest}" for name, version, digest in sorted(pins)]
    return "\n".join(lines) + "\n"


def make_lock(python: str, arch: str, out_dir: Path, pip_args: list[str], requirements: Path = REQUIREMENTS_IN) -> Path:
    """Resolve `requirements` for one node Python and platform and write its lock; return its path."""
    pyver = parse_python(python)
    platforms = wheel_platforms()
    if arch not in platforms:
        raise BadInput(f"--arch {arch!r}: the horovod role knows {', '.join(sorted(platforms))}")
    if not requirements.is_file():
        raise BadInput(f"{requirements} does not exist")
    with tempfile.TemporaryDirectory(prefix="pycli-lock-") as tmp:
        argv = [
            sys.executable, "-m", "pip", "download", "--quiet", "--dest", tmp, "--only-binary=:all:",
            "--python-version", f"{pyver[0]}.{pyver[1:]}", "--implementation", "cp", "--abi", f"cp{pyver}",
            *[f"--platform={p}" for p in platforms[arch]], "--requirement", str(requirements), *pip_args,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
            raise PycliError(f"pip could not resolve {requirements.name} for cp{pyver} {arch}: {' '.join(errors)}")
        pins = [(*wheel_pin(p.name), sha256_of(p)) for p in sorted(Path(tmp).glob("*.whl"))]
    shown = " ".join(["pycli cache lock --python", python, "--arch", arch, *(["--", *pip_args] if pip_args else [])])
    text = render_lock(pins, [
        f"Wheelhouse lock for CPython {pyver[0]}.{pyver[1:]} on {arch}: every wheel the nodes' shared environment",
        "installs, pinned by sha256 (pip --require-hashes). Written from requirements.in by",
        f"  {shown}",
        "Write it again after editing requirements.in; do not edit it by hand.",
    ])
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / lock_name(pyver, arch)
    partial = target.with_suffix(".txt.partial")
    partial.write_text(text)
    partial.replace(target)
    return target


# --- export and import ---------------------------------------------------------------------


def _carried_files(root: Path) -> Iterator[Path]:
    """Every file of a filled cache worth carrying: no locks, no half-written files."""
    for top in CARRIED:
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(root)
            if not path.is_file() or path.is_symlink():
                continue
            if path.name.endswith((".lock", ".partial", ".part")) or any(part.startswith(".partial-") for part in rel.parts):
                continue
            if top == "wheelhouse" and len(rel.parts) == 2 and path.name.endswith((".tar", ".tar.sha256")):
                continue  # a wheelhouse's archive: packed again from its folder when a node needs it
            yield rel


def export_cache(target: Path, root: Path | None = None) -> tuple[int, int]:
    """Write the cache's downloads, wheelhouses and artifacts with a manifest of their sha256s
    into the tar file `target`; return (files, bytes)."""
    root = root or cache_dir()
    files = list(_carried_files(root))
    if not files:
        raise BadInput(f"the cache {root} holds nothing to export: run 'pycli fetch INVENTORY' (or provision) first")
    manifest = "".join(f"{sha256_of(root / rel)}  {rel.as_posix()}\n" for rel in files)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    size = 0
    with tarfile.open(partial, "w") as tar:
        data = manifest.encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        for rel in files:
            tar.add(root / rel, arcname=rel.as_posix(), recursive=False)
            size += (root / rel).stat().st_size
    partial.replace(target)
    return len(files), size


def _carried_name(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(path.parts) and path.parts[0] in CARRIED and ".." not in path.parts and not path.is_absolute()


def import_cache(source: Path, root: Path | None = None) -> int:
    """Check every file of an export against its manifest, then move them into the cache;
    nothing is moved unless all of them check out. Return the number of files."""
    root = root or cache_dir()
    if not source.is_file():
        raise BadInput(f"{source} does not exist")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".import-", dir=root) as tmp:
        staging = Path(tmp)
        try:
            with tarfile.open(source) as tar:
                tar.extractall(staging, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise BadInput(f"{source} is not a pycli cache export ({exc})") from None
        if not (staging / MANIFEST).is_file():
            raise BadInput(f"{source} is not a pycli cache export (no {MANIFEST})")
        label = f"{source}: {MANIFEST}"
        manifest = read_sha256_lines(
            read_user_text(staging / MANIFEST, label), label, _carried_name, "SHA256  downloads|wheelhouse|artifacts/..."
        )
        extracted = {rel.as_posix() for rel in _carried_files(staging)}
        if extracted != set(manifest):
            extra = sorted(extracted ^ set(manifest))
            raise BadInput(f"{source} does not match its manifest ({len(extra)} file(s) differ, e.g. {extra[0]})")
        for name, digest in manifest.items():
            if sha256_of(staging / name) != digest:
                raise BadInput(f"{source}: {name} does not match its sha256 in the manifest; nothing was imported")
        for name in sorted(manifest, key=lambda n: n.endswith(".sha256")):  # a file before its .sha256
            dest = root / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(f"{dest}.lock" if not name.endswith(".sha256") else f"{dest.with_suffix('')}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                os.replace(staging / name, dest)
    return len(manifest)


def describe(root: Path | None = None) -> list[tuple[str, int, int]]:
    """(folder, files, bytes) for each carried folder of the cache."""
    root = root or cache_dir()
    rows = []
    for top in CARRIED:
        files = [f for f in _carried_files(root) if f.parts[0] == top]
        rows.append((top, len(files), sum((root / f).stat().st_size for f in files)))
    return rows

