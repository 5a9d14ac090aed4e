"""manifest.scan on a tree large enough to share its files with a forked helper (FORK_MIN_FILES):
the same listing, writable and foreign entries as one process gives, a file swapped in the
helper's share refused as in the scanner's own, and a helper that never outlives its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from blake3 import blake3

from llmgw_store.core import manifest
from tests.support.barrier import Barrier

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scan") / "tree"
    for d in range(40):
        (root / f"d{d:02}").mkdir(parents=True)
    n = manifest.FORK_MIN_FILES + 500
    for i in range(n):
        p = root / f"d{i % 40:02}" / f"f{i:05}.py"
        p.write_bytes(os.urandom(i % 3000))
        if i % 7 == 0:
            p.chmod(0o755)  # an exec bit: kind x
    (root / "big.so").write_bytes(os.urandom(3 * manifest.MMAP_MIN))
    os.link(root / "d00" / "f00000.py", root / "d01" / "hardlink.py")
    os.symlink("d00/f00000.py", root / "link")
    return root


def _reference(root: Path) -> list[tuple[str, str, int, str]]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for n in files:
            p = Path(dirpath, n)
            st = os.lstat(p)
            if os.path.islink(p):
                continue
            out.append((str(p.relative_to(root)), "x" if st.st_mode & 0o100 else "f", st.st_size,
                        blake3(p.read_bytes()).hexdigest()))
    return sorted(out)


def test_a_large_tree_scans_the_same_with_the_helper_as_without(tree, monkeypatch):
    with_helper = manifest.scan(tree, w1 := [], memo=(m1 := {}), foreign=(f1 := []))
    monkeypatch.setattr(manifest, "FORK_MIN_FILES", 10**9)
    alone = manifest.scan(tree, w2 := [], memo=(m2 := {}), foreign=(f2 := []))
    assert with_helper == alone and w1 == w2 and f1 == f2 and m1 == m2
    files = sorted((e.path, e.kind, e.size, e.digest) for e in with_helper if e.kind in "fx")
    assert files == _reference(tree)
    assert [e.digest for e in with_helper if e.path == "link"] == ["d00/f00000.py"]
    assert len(m1) == 1  # the hard-linked file, hashed once
    assert sorted(w1) == sorted(["."] + [str(p.relative_to(tree)) for p in tree.rglob("*")
                                       if not p.is_symlink() and os.lstat(p).st_mode & 0o222])


def _scan_in_a_child(tree: Path, gate: Barrier, **env: str) -> subprocess.Popen:
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from pathlib import Path; "
            "from llmgw_store.core import manifest\n"
            "try:\n"
            f"    manifest.scan(Path({str(tree)!r}))\n"
            "    print('ok')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.filename)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **gate.env("HASH_PAUSE"), **env})


@pytest.mark.parametrize("share", ["helper", "scanner"])
def test_a_file_swapped_for_a_fifo_after_the_walk_is_refused_in_either_share(tree, tmp_path, share):
    files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*.py") if not p.is_symlink())
    victim = tree / files[1 if share == "helper" else 2]  # every other file is the helper's
    gate = Barrier(tmp_path)
    proc = _scan_in_a_child(tree, gate)
    try:
        gate.reached("HASH_PAUSE", proc)
        data = victim.read_bytes()
        victim.unlink()
        os.mkfifo(victim, 0o644)
        gate.go("HASH_PAUSE")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if victim.is_fifo():
            victim.unlink()
            victim.write_bytes(data)
    assert out.split() == ["refused", str(victim)], err


def test_the_helper_dies_with_its_parent(tree, tmp_path):
    """A helper slowed to 0.2 s a batch (about 8 s for its share) stops at its next batch once its
    parent is SIGKILLed, instead of finishing its share."""
    gate = Barrier(tmp_path)
    proc = _scan_in_a_child(tree, gate, LLMGW_STORE_DEBUG_SCAN_HELPER="0.2")
    try:
        gate.reached("HASH_PAUSE", proc)
        gate.go("HASH_PAUSE")
        deadline = time.monotonic() + 60
        helper = None
        while helper is None:
            assert proc.poll() is None and time.monotonic() < deadline, "no helper was forked"
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            helper = int(kids[0]) if kids else None
        time.sleep(0.5)  # well inside its share
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed = time.monotonic()
        while time.monotonic() - killed < 3:
            try:
                state = Path(f"/proc/{helper}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"the helper {helper} was still running 3 s after its parent died")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
