"""The controller cache: whole entries only, locks, wheelhouse locks, export and import."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pycli.cli.app import main
from pycli.core import cache
from pycli.core.errors import BadInput
from tests.conftest import ROOT

ENTRY_SCRIPT = ROOT / "roles" / "artifact_cache" / "files" / "cache_entry.sh"

def entry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ENTRY_SCRIPT), *map(str, args)], capture_output=True, text=True, check=True)

def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

def test_an_entry_counts_only_with_its_matching_sha256(tmp_path):
    target = tmp_path / "artifacts" / "openmpi.tar.gz"
    assert entry("check", target).stdout == ""  # absent

    partial = tmp_path / "built.partial"
    partial.write_bytes(b"packed prefix")
    assert entry("publish", partial, target).stdout.startswith("published")
    assert not partial.exists()
    assert entry("check", target).stdout.strip() == sha(b"packed prefix")

    target.write_bytes(b"packed pre")  # truncated
    assert entry("check", target).stdout == ""
    target.write_bytes(b"packed prefix")
    Path(f"{target}.sha256").unlink()  # an artifact without its recorded checksum
    assert entry("check", target).stdout == ""

def test_a_broken_entry_is_replaced_and_a_whole_one_kept(tmp_path):
    target = tmp_path / "artifacts" / "horovod.whl"
    target.parent.mkdir()
    target.write_bytes(b"trunc")  # no .sha256: absent, so publishing replaces it
    first = tmp_path / "a.partial"
    first.write_bytes(b"wheel from run A")
    assert entry("publish", first, target).stdout.startswith("published")
    second = tmp_path / "b.partial"
    second.write_bytes(b"wheel from run B")
    assert entry("publish", second, target).stdout.startswith("kept")
    assert target.read_bytes() == b"wheel from run A" and not second.exists()

def test_runs_publishing_one_entry_at_once_leave_it_whole(tmp_path):
    target = tmp_path / "artifacts" / "openmpi.tar.gz"
    partials = []
    for i in range(8):
        partials.append(tmp_path / f"{i}.partial")
        partials[-1].write_bytes(f"build {i} ".encode() * 200_000)
    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(lambda p: entry("publish", p, target).stdout, partials))
    assert sum(out.startswith("published") for out in outputs) == 1
    assert entry("check", target).stdout.strip() == sha(target.read_bytes())

def test_a_packed_folder_is_one_entry_whose_sha256_follows_the_files_only(tmp_path):
    folder, archive = tmp_path / "wheelhouse" / "cp311-x86_64-abc", tmp_path / "wheelhouse" / "cp311-x86_64-abc.tar"
    folder.mkdir(parents=True)
    (folder / "a.whl").write_bytes(b"wheel a")
    assert entry("pack", folder, archive).stdout.startswith("packed")
    first = entry("check", archive).stdout.strip()
    assert first == sha(archive.read_bytes())
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == [".", "./a.whl"] and {m.uid for m in tar.getmembers()} == {0}

    (folder / "a.whl").touch()  # a newer time, the same bytes: the same archive
    assert entry("pack", folder, archive).stdout.startswith("kept")
    (folder / "b.whl").write_bytes(b"wheel b")
    assert entry("pack", folder, archive).stdout.startswith("packed")
    assert entry("check", archive).stdout.strip() not in ("", first)

    missing = subprocess.run([str(ENTRY_SCRIPT), "pack", str(tmp_path / "none"), str(tmp_path / "none.tar")],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "no folder" in missing.stderr and not (tmp_path / "none.tar").exists()

def test_wheel_pins_and_lock_format():
    assert cache.wheel_pin("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == ("torch", "2.13.0+cpu")
    assert cache.wheel_pin("typing_extensions-4.16.0-py3-none-any.whl") == ("typing-extensions", "4.16.0")
    text = cache.render_lock([("torch", "2.13.0", "a" * 64), ("numpy", "2.4.6", "b" * 64)], ["made by a test"])
    assert text.splitlines() == [
        "# made by a test", f"numpy==2.4.6 --hash=sha256:{'b' * 64}", f"torch==2.13.0 --hash=sha256:{'a' * 64}"]
    with pytest.raises(Exception, match="not a wheel"):
        cache.wheel_pin("horovod-0.28.1.tar.gz")

@pytest.mark.parametrize("text", ["3", "python3.11", "2.7.1", "3.x", ""])
def test_a_python_that_is_not_major_minor_is_refused(text):
    with pytest.raises(BadInput, match="MAJOR.MINOR"):
        cache.parse_python(text)

def test_the_shipped_lock_matches_the_platforms_and_pins_torch():
    assert "x86_64" in cache.wheel_platforms()
    lock = cache.LOCKS_DIR / cache.lock_name("311", "x86_64")
    lines = [line for line in lock.read_text().splitlines() if line and not line.startswith("#")]
    assert any(line.startswith("torch==2.13.0") for line in lines)
    assert all(" --hash=sha256:" in line and "==" in line for line in lines)

def fill(root: Path) -> None:
    (root / "downloads").mkdir(parents=True)
    (root / "downloads" / "openmpi.tar.xz").write_bytes(b"source")
    (root / "downloads" / ".partial-x").mkdir()
    (root / "downloads" / ".partial-x" / "half.tar.gz").write_bytes(b"ha")
    (root / "wheelhouse" / "cp311-x86_64-abc").mkdir(parents=True)
    (root / "wheelhouse" / "cp311-x86_64-abc" / "torch.whl").write_bytes(b"torch")
    (root / "wheelhouse" / "cp311-x86_64-abc.lock").write_bytes(b"")
    entry("pack", root / "wheelhouse" / "cp311-x86_64-abc", root / "wheelhouse" / "cp311-x86_64-abc.tar")  # not carried
    (root / "artifacts").mkdir()
    (root / "artifacts" / "openmpi.tar.gz").write_bytes(b"built")
    (root / "artifacts" / "openmpi.tar.gz.sha256").write_text(f"{sha(b'built')}  openmpi.tar.gz\n")
    (root / "images").mkdir()
    (root / "images" / "node.tar").write_bytes(b"not carried")

def test_export_then_import_into_an_empty_cache(tmp_path):
    source, target = tmp_path / "online", tmp_path / "offline"
    fill(source)
    files, size = cache.export_cache(tmp_path / "cache.tar", source)
    assert files == 4 and size == len(b"source" + b"torch" + b"built") + len(f"{sha(b'built')}  openmpi.tar.gz\n")
    assert cache.import_cache(tmp_path / "cache.tar", target) == 4
    assert (target / "wheelhouse" / "cp311-x86_64-abc" / "torch.whl").read_bytes() == b"torch"
    assert entry("check", target / "artifacts" / "openmpi.tar.gz").stdout.strip() == sha(b"built")
    assert not (target / "images").exists() and not (target / "downloads" / ".partial-x").exists()
    assert not list(target.glob(".import-*"))

def test_a_tampered_export_imports_nothing(tmp_path):
    fill(tmp_path / "online")
    cache.export_cache(tmp_path / "cache.tar", tmp_path / "online")
    with tarfile.open(tmp_path / "cache.tar") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(tmp_path / "bad.tar", "w") as tar:
        for member, data in members:
            data = b"evil" if member.name.endswith("torch.whl") else data
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    with pytest.raises(BadInput, match="torch.whl does not match its sha256"):
        cache.import_cache(tmp_path / "bad.tar", tmp_path / "offline")
    assert not (tmp_path / "offline" / "wheelhouse").exists()

@pytest.mark.parametrize(("manifest", "message"), [
    (b"\xff\xfe\n", "MANIFEST.sha256: not UTF-8 text"),
    (b"nonsense\n", "MANIFEST.sha256:1: "),
    (b"0" * 64 + b"  images/node.tar\n", "MANIFEST.sha256:1: "),
])
def test_a_corrupt_manifest_is_one_line(tmp_path, manifest, message):
    with tarfile.open(tmp_path / "bad.tar", "w") as tar:
        info = tarfile.TarInfo(cache.MANIFEST)
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    with pytest.raises(BadInput) as caught:
        cache.import_cache(tmp_path / "bad.tar", tmp_path / "offline")
    assert str(caught.value).startswith(f"{tmp_path / 'bad.tar'}: {message}") and "\n" not in str(caught.value)

def test_an_empty_cache_has_nothing_to_export(tmp_path):
    with pytest.raises(BadInput, match="holds nothing to export"):
        cache.export_cache(tmp_path / "x.tar", tmp_path / "empty")

@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cache", "lock", "--python", "3"], "MAJOR.MINOR"),
        (["cache", "lock", "--python", "3.11", "--arch", "sparc"], "--arch 'sparc'"),
        (["cache", "import", "/nonexistent.tar"], "/nonexistent.tar does not exist"),
        (["provision", "/nonexistent.ini", "--offline"], "/nonexistent.ini"),
    ],
)


def test_cache_commands_refuse_bad_input_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cache_export_writes_what_o_names_and_takes_the_old_argument_for_one_release(tmp_path, monkeypatch, capsys):
    from pycli.cli.app import main

    monkeypatch.setenv("PYCLI_CACHE", str(tmp_path / "online"))
    fill(tmp_path / "online")
    assert main(["cache", "export", "-o", str(tmp_path / "new.tar")]) == 0
    assert cache.import_cache(tmp_path / "new.tar", tmp_path / "offline") == 4
    assert capsys.readouterr().err == ""
    assert main(["cache", "export", str(tmp_path / "old.tar")]) == 0  # as typed before -o
    assert (tmp_path / "old.tar").is_file()
    assert capsys.readouterr().err == ("pycli: cache export FILE is now cache export -o FILE; the old name goes after "
                                       "release 0.3.0 (CHANGELOG.md)\n")
    assert main(["cache", "export"]) == 2
    assert capsys.readouterr().err == "pycli: error: cache export: give the tar file to write with -o FILE\n"
    assert main(["cache", "export", "a.tar", "-o", "b.tar"]) == 2
    assert "two tar files given, a.tar and -o b.tar; give one, with -o FILE" in capsys.readouterr().err
