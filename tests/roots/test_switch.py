"""The switch's own path (roots/switch.py, run by cli/fast.py before anything else): what it loads,
that its answer is the full command's, that it leaves what is not the common case to the full
command with nothing changed, and that a SIGKILL anywhere in it leaves the old generation or the
new one.

What it loads is read from `python -X importtime` twice: from the installed command (here an
editable install, whose finder brings re, pathlib and contextlib itself, subtracted as the
package's own import) and from the package laid out as a regular install lays it out (the
modules copied into one directory, `python -S`: no .pth, no finder), where nothing is subtracted
but what importing the package itself loads. No timing is asserted (bench/bench_profiles.py
measures)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO, build_json, cli_cmd, run_cli
from tests.support.barrier import Barrier

# What a switch has no use for. Each is milliseconds (or a chain of them) on a path whose budget is
# a couple of interpreter starts: click, pathlib (and the fnmatch, re, urllib.parse, ipaddress it
# brings), dataclasses (and inspect), typing, enum, datetime, contextlib, the library's own layers
# above the switch, and what only a check needs (procs, hashlib's OpenSSL).
SWITCH_NEVER = {"click", "pathlib", "re", "fnmatch", "urllib.parse", "ipaddress", "dataclasses", "inspect", "typing",
                "enum", "datetime", "contextlib", "ast", "tomllib", "_hashlib", "hmac", "secrets", "shlex", "getpass",
                "llmgw_store.api", "llmgw_store.roots.profiles", "llmgw_store.roots.records",
                "llmgw_store.core.index", "llmgw_store.core.layout", "llmgw_store.core.local_store",
                "llmgw_store.core.locks", "llmgw_store.core.temproots", "llmgw_store.core.manifest",
                "llmgw_store.supervise.procs", "llmgw_store.build.builder", "llmgw_store.build.lockproof"}
ROLLBACK_NEVER = SWITCH_NEVER | {"sqlite3", "_sqlite3"}  # a rollback does not tell the index


def _names(stderr: str) -> set[str]:
    return {ln.rsplit("|", 1)[-1].strip() for ln in stderr.splitlines() if ln.startswith("import time:")}


@pytest.fixture(scope="module")
def regular(tmp_path_factory) -> Path:
    """The package as a regular install lays it out: store/ as llmgw_store, cli/ as llmgw_store.cli."""
    d = tmp_path_factory.mktemp("regular")
    shutil.copytree(REPO / "store", d / "llmgw_store", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "cli", d / "llmgw_store" / "cli", ignore=shutil.ignore_patterns("__pycache__"))
    return d


def loaded(root: Path, *args: str, env: dict, regular: Path | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The command's process and the modules it loaded beyond importing the package."""
    full_env = {**os.environ, **env}
    if regular is None:
        argv = [sys.executable, "-X", "importtime", *cli_cmd(root, *args)]
        base_argv = [sys.executable, "-X", "importtime", "-c", "import llmgw_store.cli"]
    else:
        paths = [str(regular), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        head = f"import sys; sys.path[:0] = {paths!r}; "
        argv = [sys.executable, "-S", "-X", "importtime", "-c",
                head + "sys.argv[0] = 'llmgw-store'; from llmgw_store.cli import main; sys.exit(main())",
                "--root", str(root), *args]
        base_argv = [sys.executable, "-S", "-X", "importtime", "-c", head + "import llmgw_store.cli"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=full_env)
    base = subprocess.run(base_argv, capture_output=True, text=True, timeout=60, check=True, env=full_env)
    return proc, _names(proc.stderr) - (_names(base.stderr) - {"llmgw_store", "llmgw_store.cli"})


@pytest.fixture
def store(tmp_path, root, recipe, index, uv_bin):
    a = build_json(root, recipe, index, uv_bin)["path"]
    b = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"]
    run_cli(root, "activate", "p", a, check=True)
    run_cli(root, "activate", "p", b, check=True)  # each path's lock proved once (and the proof kept)
    run_cli(root, "rollback", "p", check=True)
    conf = tmp_path / "config.toml"
    conf.write_text(f'index_url = "{index.url}"\nuv = "{uv_bin}"\nlock_timeout = 30\n')
    env = {"LLMGW_STORE_CONFIG": str(conf), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run_cli(root, "config", env=env, check=True)  # the full command reads the file once
    return {"a": a, "b": b, "env": env, "recipe": recipe}


def _current(root: Path) -> str:
    return os.path.realpath(root / "profiles" / "p")


@pytest.mark.parametrize("layout", ["editable", "regular"])
def test_a_switch_loads_only_what_a_switch_needs(root, store, regular, layout):
    where = regular if layout == "regular" else None
    steps = [(["activate", "p", store["b"]], store["b"], SWITCH_NEVER),  # generation 3
             (["rollback", "p", "--to", "1"], store["a"], ROLLBACK_NEVER),
             (["--json", "activate", "p", "p@3"], store["b"], SWITCH_NEVER),  # 4
             (["rollback", "p", "--to", "1"], store["a"], ROLLBACK_NEVER),
             (["activate", "p", os.path.basename(store["b"])[:32]], store["b"], SWITCH_NEVER),  # 5, by its key
             (["rollback", "p"], store["b"], ROLLBACK_NEVER)]  # to 4
    for args, now, never in steps:
        proc, names = loaded(root, *args, env=store["env"], regular=where)
        assert proc.returncode == 0, proc.stderr
        assert _current(root) == now, args
        assert "llmgw_store.roots.switch" in names, (args, "the switch's own path did not answer")
        assert not names & never, (args, sorted(names & never))


def test_the_switch_answers_as_the_full_command(root, store):
    """The same lines, the same document, the same generation numbers, records and history as the
    full command (profiles.activate / rollback, run through the api in-process here)."""
    from llmgw_store.core.layout import Layout
    from llmgw_store.roots import records

    proc = run_cli(root, "--json", "activate", "p", store["b"], env=store["env"], check=True)
    assert json.loads(proc.stdout) == {"schema_version": 1, "profile": "p", "generation": 3, "previous": 1,
                                       "path": store["b"], "changed": True, "check": None, "rebuilt": None}
    proc = run_cli(root, "activate", "p", store["b"], env=store["env"], check=True)
    assert proc.stdout == f"p: already at generation 3 -> {store['b']}\n"
    proc = run_cli(root, "rollback", "p", "--to", "1", env=store["env"], check=True)
    assert proc.stdout == f"p: generation 3 -> 1 ({store['a']})\n"
    proc = run_cli(root, "--json", "rollback", "p", "--to", "1", env=store["env"], check=True)
    assert json.loads(proc.stdout) == {"schema_version": 1, "profile": "p", "generation": 1, "previous": 1,
                                       "path": store["a"], "changed": False, "check": None, "rebuilt": None}
    layout = Layout.at(root)
    # The record the switch wrote passes every check of the full reader, and says what the full
    # command's record of the same path says (generation 2, written by the full command).
    mine, theirs = records.load(layout, "p", 3), records.load(layout, "p", 2)
    assert mine is not None and theirs is not None and mine.lock
    assert mine.activation == {"kind": "activate", "from": 1, "check": None}
    same = ("name", "key", "content_hash", "engine", "version", "variant", "inputs", "requirements", "lock_format",
            "lock", "by")
    assert {f: getattr(mine, f) for f in same} == {f: getattr(theirs, f) for f in same}
    raw = (root / "profiles" / ".p-3.record").read_bytes()
    assert raw == json.dumps(json.loads(raw), indent=1, sort_keys=True).encode() + b"\n"
    assert oct((root / "profiles" / ".p-3.record").stat().st_mode & 0o777) == "0o600"
    events = [(e["event"], e.get("from"), e.get("to"), e.get("name")) for e in records.history(layout, "p")]
    assert events[-2:] == [("activate", 1, 3, os.path.basename(store["b"])),
                           ("rollback", 3, 1, os.path.basename(store["a"]))]
    listed = json.loads(run_cli(root, "--json", "generations", "p", check=True).stdout)
    assert listed["index_differs"] == [] and [g["number"] for g in listed["generations"]] == [1, 2, 3]
    assert [g["record"] for g in listed["generations"]] == [True, True, True]


def test_the_index_is_told_without_a_checkpoint(root, store):
    """The generation row is committed in the WAL; the database file itself is not rewritten on the
    switch's path (the next full command checkpoints)."""
    db = root / "var" / "db.sqlite"
    run_cli(root, "gc", "--dry-run", check=True)  # a full command that opens the index to write: closing, it checkpoints
    before = db.stat().st_mtime_ns, db.read_bytes()
    run_cli(root, "activate", "p", store["b"], env=store["env"], check=True)
    assert (db.stat().st_mtime_ns, db.read_bytes()) == before
    assert os.path.getsize(f"{db}-wal") > 0
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert conn.execute("SELECT name FROM generations WHERE profile = 'p' AND number = 3").fetchone()[0] \
        == os.path.basename(store["b"])
    conn.close()


def test_what_is_not_the_common_case_goes_to_the_full_command(root, store, tmp_path):
    """A lock held by another process, a temporary a killed change left, an index that differs
    from the links, a cold generation: the full command runs (and answers as it always did)."""
    # A temporary left by a killed change: cleared by the full command, then switched.
    stray = root / "profiles" / ".p.tmp-999999"
    os.symlink("p-1-link", stray)
    proc, names = loaded(root, "activate", "p", store["b"], env=store["env"])
    assert proc.returncode == 0 and "llmgw_store.roots.profiles" in names and not os.path.lexists(stray)
    # The index lost a generation's row: the full command repairs it.
    import sqlite3

    conn = sqlite3.connect(root / "var" / "db.sqlite")
    conn.execute("DELETE FROM generations WHERE profile = 'p' AND number = 1")
    conn.commit()
    conn.close()
    proc, names = loaded(root, "rollback", "p", "--to", "1", env=store["env"])
    assert proc.returncode == 0 and _current(root) == store["a"]
    proc, names = loaded(root, "activate", "p", store["b"], env=store["env"])
    assert proc.returncode == 0 and "llmgw_store.roots.profiles" in names
    listed = json.loads(run_cli(root, "--json", "generations", "p", check=True).stdout)
    assert listed["index_differs"] == []
    # Not a generation at all: the full command's error, exit code and JSON.
    proc = run_cli(root, "--json", "rollback", "p", "--to", "99", env=store["env"])
    assert proc.returncode != 0 and json.loads(proc.stdout)["error"]


@pytest.mark.parametrize("point", ["BEFORE_SWITCH", "AFTER_SWITCH"])
def test_a_killed_switch_leaves_the_old_or_the_new_generation(root, store, tmp_path, point):
    """SIGKILL at each pause point of the switch's own path: the profile resolves to a complete
    generation, and the next switch (which clears what was left) works."""
    barrier = Barrier(tmp_path / f"barrier-{point}")
    env = {**os.environ, **store["env"], **barrier.env(point)}
    before = _current(root)
    proc = subprocess.Popen(cli_cmd(root, "activate", "p", store["b"]), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        barrier.reached(point, proc)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    after = _current(root)
    assert after in (before, store["b"]) and os.path.isdir(after)
    assert after == (before if point == "BEFORE_SWITCH" else store["b"])
    run_cli(root, "rollback", "p", "--to", "1", env=store["env"], check=True)
    assert _current(root) == store["a"]
    run_cli(root, "activate", "p", store["b"], env=store["env"], check=True)
    assert _current(root) == store["b"]


def test_a_switch_reads_the_kept_proof_not_the_listing(root, store):
    """The lock a record keeps is proved when the path is built and the proof kept, keyed with the
    records key: a switch hashes the manifest's lock only. A proof that does not check (forged,
    for other content, a link) is no proof: the full command proves the lock again from the
    listing, and writes the proof again."""
    name = os.path.basename(store["b"])
    proof = root / "var" / "lockproofs" / name
    doc = json.loads(proof.read_text())
    assert set(doc) == {"name", "content_hash", "lock_format", "lock_blake3", "mac"}
    assert oct(proof.stat().st_mode & 0o777) == "0o600"
    for forged in ({**doc, "content_hash": "0" * 64}, {**doc, "lock_blake3": "0" * 64}, {**doc, "mac": "0" * 64}):
        proof.write_text(json.dumps(forged))
        proc, names = loaded(root, "activate", "p", store["b"], env=store["env"])
        assert proc.returncode == 0 and _current(root) == store["b"], proc.stderr
        assert "llmgw_store.roots.profiles" in names and "llmgw_store.build.lockproof" in names
        assert json.loads(proof.read_text()) == doc  # proved again, kept again
        run_cli(root, "rollback", "p", "--to", "1", env=store["env"], check=True)
    proc, names = loaded(root, "activate", "p", store["b"], env=store["env"])
    assert proc.returncode == 0 and "llmgw_store.roots.profiles" not in names
    # A proof reached through a link is no proof (read without following one).
    proof.unlink()
    os.symlink("/etc/passwd", proof)
    run_cli(root, "rollback", "p", "--to", "1", env=store["env"], check=True)
    proc, names = loaded(root, "activate", "p", store["b"], env=store["env"])
    assert proc.returncode == 0 and "llmgw_store.roots.profiles" in names


def test_the_switch_agrees_with_the_modules_it_stands_in_for():
    """The constants roots/switch.py repeats (it does not import those modules) are theirs."""
    from llmgw_store.core import manifest, proofs
    from llmgw_store.roots import records, switch

    assert switch.RECORD_FORMAT == records.FORMAT and switch.RECORD_MAX == records.RECORD_MAX
    assert switch.HISTORY_ROTATE_BYTES == records.HISTORY_ROTATE_BYTES and switch.FILE_MODE == records.FILE_MODE
    assert switch.MANIFEST_MAX == manifest.MANIFEST_MAX and switch.LIST_MAX == records._LIST_MAX
    assert proofs.SECRET_FILE == records.SECRET_FILE and proofs.SECRET_BYTES == records.SECRET_BYTES
    assert proofs.LOCK_FORMATS == records.LOCK_FORMATS
    from llmgw_store.core.names import check_profile

    for name in ("p", "vllm", "a.b_c-d", "x-1-link", "x-01-link", "x-0-link", "x--link", "link", "a-link", "-a", ".a",
                 "A", "a" * 100, "a" * 101, "é", "a/b", "", "x-1-linkx", "1-link", "a-1-2-link"):
        try:
            check_profile(name)
            valid = True
        except Exception:
            valid = False
        assert switch._profile_ok(name) == valid, name


def test_json_through_the_c_codec_is_json():
    """system/jsontext gives json's bytes for what a switch writes and reads."""
    from llmgw_store.system import jsontext

    docs = [{"a": 1, "b": [1, 2, {"c": "é\n\"x", "d": []}], "e": {}, "f": None, "g": True, "h": 1.5, "i": -0.0,
             "k": "\u2028 \x00", "t": (1, "x")}, [], {}, "x", 3, [{"z": [[]]}]]
    for d in docs:
        for n in (1, 2):
            assert jsontext.indented(d, n) == json.dumps(d, indent=n, sort_keys=True)
        assert jsontext.line(d) == json.dumps(d, sort_keys=True)
        assert jsontext.canonical(d) == json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert jsontext.loads(json.dumps(d, indent=2)) == json.loads(json.dumps(d)) == jsontext.loads(json.dumps(d).encode())
    for bad in ("", "{", "1 2", "[1,]", "nul", "{'a': 1}", b"\xff"):
        with pytest.raises(ValueError):
            jsontext.loads(bad)
    with pytest.raises(TypeError):
        jsontext.indented({1: "a"})


def test_gc_takes_a_dead_paths_proof_with_it(root, store, recipe, index, uv_bin):
    """A proof is kept per store path; gc removes it with the path (var/ does not grow)."""
    c = build_json(root, recipe, index, uv_bin, "--as-of", "2024-08-02")["path"]
    proofs_dir = root / "var" / "lockproofs"
    assert (proofs_dir / os.path.basename(c)).is_file()
    run_cli(root, "gc", check=True)
    assert not os.path.exists(c) and not (proofs_dir / os.path.basename(c)).exists()
    assert {p.name for p in proofs_dir.iterdir()} == {os.path.basename(store["a"]), os.path.basename(store["b"])}
