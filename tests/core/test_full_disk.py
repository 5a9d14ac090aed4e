"""A disk that refuses: gc on a real full tmpfs frees a dead path and the index agrees (with the
reserve, and without one); every other command on a full disk, on a read-only filesystem, or on a
root it may not write is one line naming the cause, with its exit code, and nothing half-changed.

The filesystems are real: a tmpfs mounted for the test (root only; skipped elsewhere), filled
until the kernel says ENOSPC, or remounted read-only.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from llmgw_store.base.errors import AccessDeniedError, DiskFullError, ReadOnlyError, cut_at_word, from_os_error
from llmgw_store.core.index import Index
from tests.conftest import build_store, copy_store, run_cli, write_recipe
from tests.support.tmpfs import tmpfs as mounted_tmpfs
from tests.support.wheels import build_wheel

# Two keys of one recipe: p holds OLD (tinydep 1.0); NEW resolves tinydep 2.0, whose 4 MiB of
# incompressible data no other path shares, so deleting NEW frees real blocks.
OLD, NEW = "2024-02-02", "2024-08-01"
MiB = 1 << 20


@pytest.fixture(scope="module")
def fat_wheels(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fullwheels")
    script = {"tinyengine": "tinyengine:main"}
    payload = random.Random(26).randbytes(4 * MiB)
    return {
        "tinydep-1.0": build_wheel(d, "tinydep", "1.0"),
        "tinydep-2.0": build_wheel(d, "tinydep", "2.0", extra_files={"tinydep/data.bin": payload}),
        "tinyengine-1.0": build_wheel(d, "tinyengine", "1.0", requires=("tinydep",), scripts=script),
        "tinyengine-1.1": build_wheel(d, "tinyengine", "1.1", requires=("tinydep",), scripts=script),
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory, fat_wheels):
    t = build_store(tmp_path_factory.mktemp("full"), fat_wheels, OLD, NEW)
    run_cli(t["root"], "activate", "p", t["paths"][0], check=True)
    yield t
    t["index"].stop()


@pytest.fixture
def tmpfs(tmp_path):
    """A fresh tmpfs (64 MiB): only this test writes to it."""
    with mounted_tmpfs(tmp_path / "mnt", "64m") as mnt:
        yield mnt


def fill(mnt: Path) -> Path:
    """Write a file on `mnt` until the kernel refuses even one more byte."""
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            while True:
                try:
                    f.write(b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    assert os.statvfs(mnt).f_bavail == 0
    return filler


def store_on(template, mnt: Path) -> Path:
    return copy_store(template["root"], mnt / "root")


def names(root: Path) -> set[str]:
    return {e.name for e in (root / "store").iterdir() if not e.name.startswith(".")}


def listed(root: Path) -> set[str]:
    doc = json.loads(run_cli(root, "--json", "list", check=True).stdout)
    rows = doc["paths"] if isinstance(doc, dict) else doc
    return {Path(r["path"]).name for r in rows}


def one_line(proc, code: int, *fragments: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("llmgw-store:")]
    assert len(errors) == 1 and errors[0].startswith("llmgw-store: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in errors[0], (f, errors[0])
    return errors[0]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry of the root but var/ (the index's own files, the reserve): kind, size, target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == "var" or rel_dir.startswith("var/"):
            continue
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if p == os.path.join(root, "var"):
                continue
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, os.readlink(p) if os.path.islink(p) else None)
    return out


# --- gc on a full disk -------------------------------------------------------------------------------

@pytest.mark.parametrize("reserve", ["with-reserve", "without-reserve"])
def test_gc_on_a_full_disk_frees_the_dead_path_and_the_index_agrees(template, tmpfs, reserve):
    root = store_on(template, tmpfs)
    live = template["names"][0]
    if reserve == "with-reserve":
        # what a build leaves (core/reserve.py): the copy has it if the template's builds made it
        assert (root / "var" / "gc-reserve").is_file()
    else:
        (root / "var" / "gc-reserve").unlink(missing_ok=True)
    fill(tmpfs)
    proc = run_cli(root, "gc")
    assert proc.returncode == 0, proc.stderr
    assert names(root) == {live}
    assert listed(root) == {live}
    doctor = run_cli(root, "--json", "doctor")
    assert doctor.returncode == 0 and json.loads(doctor.stdout)["ok"], doctor.stdout
    assert run_cli(root, "--json", "verify").returncode == 0
    # and the store can be used again: the profile still runs
    assert run_cli(root, "run", "p", "--", "tinyengine").returncode == 0


def test_gc_remakes_its_reserve_when_it_has_freed_space(template, tmpfs):
    root = store_on(template, tmpfs)
    (root / "var" / "gc-reserve").unlink(missing_ok=True)
    run_cli(root, "gc", check=True)
    st = (root / "var" / "gc-reserve").stat()
    assert st.st_size >= 8 << 20 and st.st_blocks * 512 >= 8 << 20  # real blocks, not a sparse file
    assert (st.st_mode & 0o777) == 0o600


# --- other commands on a full disk: one line, exit 1, nothing half-changed ---------------------------

def full_disk_cases(template, tmp: Path) -> list[tuple[list[str], tuple[str, ...]]]:
    dead = template["names"][1]
    recipe = write_recipe(tmp, 'version = "1.1"', name="newer.toml")
    return [
        (["activate", "p", dead], ("no space left",)),
        (["activate", "q", dead], ("no space left",)),
        (["pin", "keep", dead], ("no space left",)),
        (["build", str(recipe), "--index-url", template["index"].url, "--uv", str(template["uv"]),
          "--as-of", "2024-08-01"], ("no space left",)),
    ]


@pytest.mark.parametrize("held", ["index-closed", "index-held-open"])
def test_other_commands_on_a_full_disk_say_so_and_change_nothing(template, tmpfs, tmp_path, uv_bin, held):
    """Closed, the index itself cannot open (no room for its shared memory); held open by another
    process (a build in flight), it opens, and what fails is a file the command writes."""
    root = store_on(template, tmpfs)
    t = {**template, "uv": uv_bin}
    (root / "var" / "gc-reserve").unlink(missing_ok=True)
    holder = Index(root / "var" / "db.sqlite") if held == "index-held-open" else None
    try:
        if holder is not None:
            holder.paths()
        fill(tmpfs)
        before = snapshot(root)
        for args, fragments in full_disk_cases(t, tmp_path):
            proc = run_cli(root, *args)
            line = one_line(proc, 1)
            assert any(f in line.lower() for f in fragments + ("disk is full", "no space")), (args, line)
            assert snapshot(root) == before, args
    finally:
        if holder is not None:
            holder.close()
    if held == "index-closed":
        # A switch (roots/switch.py) opened the index and closed it without the checkpoint of a last
        # connection: the WAL and its shared memory are still there, and reading needs no room.
        proc = run_cli(root, "list")
        assert proc.returncode == 0 and proc.stdout.count("tinyengine") == 2, proc.stderr
    # ...but the engine still starts: run and env read the store's links and manifests.
    assert run_cli(root, "env", "p").returncode == 0
    proc = run_cli(root, "run", "p", "--", "tinyengine")
    assert proc.returncode == 0 and "tinyengine 1.0" in proc.stdout, proc.stderr


# --- a read-only filesystem --------------------------------------------------------------------------

def test_a_read_only_filesystem_is_one_line_and_looking_still_works(template, tmpfs, tmp_path, uv_bin):
    root = store_on(template, tmpfs)
    t = {**template, "uv": uv_bin}
    done = subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot remount read-only: {done.stderr.strip()}")
    before = snapshot(root)
    for args, _ in full_disk_cases(t, tmp_path) + [(["gc"], ()), (["unpin", "nothing"], ())]:
        proc = run_cli(root, *args)
        if args == ["unpin", "nothing"]:
            assert proc.returncode in (1, 2), proc.stderr
            continue
        one_line(proc, 1, "read-only")
    assert snapshot(root) == before
    assert listed(root) == set(template["names"])
    for looking in (["--json", "stats"], ["verify"], ["info", "p"], ["packages", "p"], ["env", "p"]):
        proc = run_cli(root, *looking)
        assert proc.returncode == 0, (looking, proc.stderr)
    assert run_cli(root, "run", "p", "--", "tinyengine").returncode == 0


# --- the translator ----------------------------------------------------------------------------------

def test_os_errors_that_say_why_the_disk_refused_become_typed_errors():
    full = from_os_error(OSError(errno.ENOSPC, "No space left on device", "/r/var/db.sqlite-wal"))
    assert isinstance(full, DiskFullError) and full.exit_code == 1 and "/r/var/db.sqlite-wal" in str(full)
    assert isinstance(from_os_error(OSError(errno.EDQUOT, "Disk quota exceeded")), DiskFullError)
    ro = from_os_error(OSError(errno.EROFS, "Read-only file system", "/r/profiles"))
    assert isinstance(ro, ReadOnlyError) and ro.exit_code == 1 and "/r/profiles" in str(ro)
    denied = from_os_error(PermissionError(errno.EACCES, "Permission denied", "/r/var"))
    assert isinstance(denied, AccessDeniedError) and denied.exit_code == 2
    assert from_os_error(OSError(errno.EIO, "Input/output error")) is None  # a bug stays a bug
    assert from_os_error(ValueError("x")) is None


def test_a_long_reason_is_cut_at_a_word_not_mid_word():
    text = "error: " + " ".join(["no-space-left-on-device"] * 60)
    cut = cut_at_word(text, 600)
    assert len(cut) <= 600 and cut.endswith("…")
    assert cut[:-1].split(" ")[-1] == "no-space-left-on-device"
