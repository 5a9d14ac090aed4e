"""Temp roots of containers sharing a root: two store processes that are both pid 1 (each the first
process of its own pid namespace, `unshare --pid --fork`) must not delete each other's temp-roots
file. Before, the second one unlinked the first's `var/temproots/1` to make its own; gc then
deleted the first one's live `.partial` and its key lock. A file is named by pid and a random
token, created exclusively, never unlinked by another live process, and removed by gc only once
its flock can be taken (its process is gone)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw_store.core import temproots
from llmgw_store.core.layout import Layout
from tests.conftest import build_store, cli_cmd, copy_store, run_cli
from tests.support.barrier import Barrier


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("ns"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a second pid namespace")
    root = copy_store(template["root"], tmp_path / "root")
    return {**template, "root": root, "path": str(root / "store" / template["names"][0])}


def in_new_pid_ns(root: Path, *args: str) -> list[str]:
    return ["unshare", "--pid", "--fork", *cli_cmd(root, *args)]


def test_two_pid_1_processes_keep_their_own_temp_roots_and_gc_keeps_the_live_partial(store, uv_bin, tmp_path):
    root = store["root"]
    for f in (root / "var" / "temproots").iterdir():  # the template's builders are gone: start clean
        f.unlink()
    gate = Barrier(tmp_path)
    # A: pid 1 of its namespace, building a new key; held with its .partial (and temp root) made
    build = subprocess.Popen(
        in_new_pid_ns(root, "--json", "build", str(store["recipe"]), "--as-of", "2024-06-02", "--index-url",
                      store["index"].url, "--uv", str(uv_bin)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **gate.env("BUILD_PAUSE")})
    try:
        gate.reached("BUILD_PAUSE", build)
        partials = list((root / "store").glob("*.partial"))
        assert len(partials) == 1
        files_a = sorted(p.name for p in (root / "var" / "temproots").iterdir())
        assert len(files_a) == 1  # A's, pid 1 (and its own token)
        # B: pid 1 of another namespace adds a temp root of its own (a pin), and exits
        proc = subprocess.run(in_new_pid_ns(root, "pin", "b", store["path"]), capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        # gc, meanwhile: A's file is held (live), B's is not (stale, removed)
        gc = run_cli(root, "--json", "gc")
        assert gc.returncode == 0, gc.stderr
        assert partials[0].is_dir(), "gc deleted the live build's .partial"
        assert (root / "var" / "locks" / f"{partials[0].name[:32]}.lock").exists()
        assert [p.name for p in (root / "var" / "temproots").iterdir()] == files_a
    finally:
        gate.go("BUILD_PAUSE")
        out, err = build.communicate(timeout=300)
    assert build.returncode == 0, err
    path = Path(json.loads(out)["path"])
    assert path.is_dir() and run_cli(root, "verify", str(path)).returncode == 0


def test_a_process_never_removes_a_live_file_of_its_own_pid(store, tmp_path):
    """The same pid in two namespaces, directly: the second file is another name, the first stays
    flocked, and gc reads both as live."""
    layout = Layout.at(store["root"])
    for f in layout.temproots.iterdir():  # the template's builders are gone: start clean
        f.unlink()
    script = (
        "import os, sys, time\n"
        "from llmgw_store.core.layout import Layout\n"
        "from llmgw_store.core.temproots import TempRoots\n"
        "t = TempRoots(Layout.at(sys.argv[1]))\n"
        "t.add(sys.argv[2])\n"
        "print(t.path.name, flush=True)\n"
        "sys.stdin.read()\n"  # alive (and its file flocked) until the test closes stdin
    )
    import sys

    procs = [subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", script, str(layout.root), name],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for name in ("name-a", "name-b")]
    try:
        names = [p.stdout.readline().strip() for p in procs]
        assert names[0] != names[1] and all(n.startswith("1-") for n in names)
        from llmgw_store.core.temproots import gc_lock

        with gc_lock(layout, shared=False):
            live, stale = temproots.read_all(layout)
        assert {"name-a", "name-b"} <= live and stale == []
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
    with gc_lock(layout, shared=False):
        live, stale = temproots.read_all(layout)
        assert not {"name-a", "name-b"} & live and len(stale) == 2
        assert temproots.remove_stale(stale) == 2
    assert list(layout.temproots.iterdir()) == []
