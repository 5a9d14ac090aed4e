"""The wheel home (build/wheelhome.py): environments hard-link their wheels' files from one sealed,
store-owned copy, and nothing a user, uv or an engine can write shares an inode with them.

Attacks: an edit in place to a linked file (then another environment is built and verified), a
file or an entry planted in the wheel home by another user, an entry whose bytes do not match its
wheel's RECORD (damaged before it was sealed, or a wheel that lies), an edit made while a build
holds the linked files. Positive cases beside them: what is shared, what gc keeps and takes, what
an older store's uv cache becomes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from llmgw_store.core import manifest
from tests.conftest import RELEASE_DATES, build_json, cli_cmd, real_uv, run_cli, run_in_env, start_index, write_recipe
from tests.core.test_dedupe import tamper_in_place
from tests.core.test_local_safety import as_intruder, intruder, shared  # noqa: F401 - fixtures
from tests.support.barrier import Barrier
from tests.support.index_server import PackageIndex
from tests.support.wheels import build_wheel

EARLY, LATE = "2024-02-02", "2024-06-02"  # tinyengine 1.0 with tinydep 1.0, then with tinydep 2.0
ENV = {"LLMGW_STORE_PYTHON_PREFERENCE": "only-system"}


@pytest.fixture
def idx(wheels):
    i = start_index(wheels)
    yield i
    i.stop()


def build(root: Path, idx, as_of: str, **kw) -> Path:
    recipe = write_recipe(root.parent, 'version = "1.0"', name=f"tiny-{as_of}.toml")
    return Path(build_json(root, recipe, idx, real_uv(), "--as-of", as_of, **kw)["path"])


def build_proc(root: Path, idx, as_of: str, env: dict | None = None) -> subprocess.CompletedProcess:
    recipe = write_recipe(root.parent, 'version = "1.0"', name=f"tiny-{as_of}.toml")
    return run_cli(root, "--json", "build", str(recipe), "--index-url", idx.url, "--uv", str(real_uv()),
                   "--as-of", as_of, env=env)


def build_held(root: Path, idx, as_of: str, tmp: Path, inside) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a build held at WHEELS_LINKED (uv has linked the wheel
    home's files into the .partial; nothing is sealed or checked yet) while `inside()` runs."""
    gate = Barrier(tmp)
    recipe = write_recipe(tmp, 'version = "1.0"', name=f"held-{as_of}.toml")
    proc = subprocess.Popen(cli_cmd(root, "--json", "build", str(recipe), "--index-url", idx.url, "--uv",
                                    str(real_uv()), "--as-of", as_of),
                            env={**os.environ, **ENV, **gate.env("WHEELS_LINKED")},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("WHEELS_LINKED", proc)
        inside()
        gate.go("WHEELS_LINKED")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def site(path: Path) -> Path:
    return next(path.glob("lib/python3*/site-packages"))


def module(path: Path, project: str = "tinyengine") -> Path:
    return site(path) / project / "__init__.py"


def ino(p: Path) -> tuple[int, int]:
    st = os.lstat(p)
    return st.st_dev, st.st_ino


def home(root: Path) -> Path:
    return root / "store" / ".wheels"


def entry_of(root: Path, f: Path) -> Path | None:
    """The wheel home entry holding the inode of `f`, if any."""
    want = ino(f)
    for dirpath, _, names in os.walk(home(root)):
        for n in names:
            if ino(Path(dirpath, n)) == want:
                return home(root) / Path(dirpath).relative_to(home(root)).parts[0]
    return None


def home_inodes(root: Path) -> set[tuple[int, int]]:
    return {ino(Path(d, n)) for d, _, ns in os.walk(home(root)) for n in ns}


def verify(root: Path, *args: str) -> tuple[int, dict]:
    proc = run_cli(root, "--json", "verify", *args, timeout=600, env=ENV)
    return proc.returncode, json.loads(proc.stdout)


def runs(env: Path) -> str:
    return subprocess.run([str(env / "bin" / "tinyengine")], capture_output=True, text=True, check=True).stdout.strip()


# --- what is shared, and with what ---------------------------------------------------------------

def test_environments_link_their_wheels_from_the_sealed_wheel_home_and_nothing_else(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    # uv's archive bucket is the store's link to the wheel home: uv unpacks there and links from there
    assert os.readlink(root / "cache" / "uv" / "archive-v0") == "../../store/.wheels"
    entry = entry_of(root, module(a))
    assert entry is not None and os.lstat(module(a)).st_nlink == 2  # a's name and the wheel home's
    # sealed: the store's user, canonical modes, time 1, and a seal listing every file with its blake3
    for dirpath, _dirs, files in os.walk(entry):
        for p in [Path(dirpath)] + [Path(dirpath, n) for n in files]:
            st = os.lstat(p)
            assert st.st_uid == os.geteuid() and st.st_mtime == 1, p
            assert stat.S_IMODE(st.st_mode) == (0o555 if p.is_dir() or st.st_mode & 0o100 else 0o444), p
    seal = {e.path: e for e in manifest.parse_contents((root / "var" / "wheels" / entry.name).read_bytes())}
    assert seal["tinyengine/__init__.py"].digest == manifest.file_digest(module(a))
    assert stat.S_IMODE(os.lstat(root / "var" / "wheels" / entry.name).st_mode) == 0o600
    # no file of the environment shares an inode with uv's cache (its bucket is only a link now);
    # the bytecode cache's entries are links to its pycs (bytecode.link_cache), and nothing else of it
    in_cache = {ino(Path(d, n)) for d, _, ns in os.walk(root / "cache" / "uv") for n in ns}
    mine = {ino(p) for p in a.rglob("*") if p.is_file() and not p.is_symlink()}
    assert not mine & in_cache
    in_pyc_cache = {ino(Path(d, n)) for d, _, ns in os.walk(root / "cache" / "pyc") for n in ns}
    assert mine & in_pyc_cache and mine & in_pyc_cache <= {ino(p) for p in a.rglob("*.pyc")}
    # every file of a with another link is a wheel home file
    shared_inodes = {ino(p) for p in a.rglob("*") if p.is_file() and not p.is_symlink() and os.lstat(p).st_nlink > 1}
    assert shared_inodes <= home_inodes(root) | {ino(p) for p in (root / "store" / ".links").iterdir()}

    b = build(root, idx, LATE)
    assert ino(module(b)) == ino(module(a))  # one tinyengine 1.0 for both
    assert ino(module(b, "tinydep")) != ino(module(a, "tinydep"))  # tinydep 2.0 is b's own wheel
    assert runs(a) == "tinyengine 1.0 tinydep 1.0" and runs(b) == "tinyengine 1.0 tinydep 2.0"
    code, r = verify(root)
    assert code == 0 and r["damaged"] == []


# --- an edit in place never reaches another environment -------------------------------------------

def test_an_edit_in_place_to_a_linked_file_never_reaches_the_next_environment(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    good = module(a).read_bytes()
    damaged = ino(module(a))
    tamper_in_place(module(a))  # through a's name: the wheel home's file is the same inode
    proc = build_proc(root, idx, LATE)
    assert proc.returncode == 0, proc.stderr
    assert "changed since it was sealed" in proc.stderr and "building again" in proc.stderr
    b = Path(json.loads(proc.stdout)["path"])
    assert module(b).read_bytes() == good and ino(module(b)) != damaged
    assert damaged not in home_inodes(root)  # the damaged copy left the wheel home
    code, r = verify(root, str(b))
    assert code == 0 and r["damaged"] == []
    code, r = verify(root)
    rel = str(module(a).relative_to(a))
    assert code == 1 and r["damaged"] == [a.name]
    assert [p["modified"] for p in r["paths"] if p["name"] == a.name] == [[rel]]
    assert runs(b) == "tinyengine 1.0 tinydep 2.0"


def test_an_edit_while_a_build_holds_the_linked_files_is_caught_before_registration(tmp_path, idx):
    """The window between uv linking the files and the tree's hashing: an edit there (to a sealed
    entry's file) is found by the digest check, not recorded as the new path's content."""
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    good = module(a).read_bytes()
    code, out, err = build_held(root, idx, LATE, tmp_path, lambda: tamper_in_place(module(a)))
    assert code == 0, err
    assert "changed since it was sealed" in err
    b = Path(json.loads(out)["path"])
    assert module(b).read_bytes() == good
    assert verify(root, str(b))[0] == 0 and verify(root, str(a))[0] == 1


# --- verify names every path; repair writes new inodes --------------------------------------------

def test_a_damaged_shared_inode_is_named_in_every_path_and_repair_gives_each_a_new_inode(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    b = build(root, idx, LATE)
    rel = str(module(a).relative_to(a))
    shared_ino = ino(module(a))
    assert ino(module(b)) == shared_ino
    good = module(a).read_bytes()
    tamper_in_place(module(a))
    code, r = verify(root)
    assert code == 1 and sorted(r["damaged"]) == sorted([a.name, b.name])
    assert all(p["modified"] == [rel] for p in r["paths"])

    proc = run_cli(root, "--json", "verify", str(a), "--repair", "--uv", str(real_uv()), timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert ino(module(a)) != shared_ino and module(a).read_bytes() == good  # a new inode, checked bytes
    assert ino(module(b)) == shared_ino  # the other path's inode was not written: still damaged, still named
    assert verify(root, str(b))[0] == 1
    proc = run_cli(root, "--json", "verify", "--repair", "--uv", str(real_uv()), timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert ino(module(b)) != shared_ino and module(b).read_bytes() == good
    assert verify(root)[0] == 0


# --- what another user plants is refused ----------------------------------------------------------

@pytest.mark.parametrize("plant", ["extra-file", "file-owned-by-them", "unsealed-entry-owned-by-them"])
def test_a_file_planted_in_the_wheel_home_as_another_user_is_refused(shared, intruder, wheels, plant):
    base = shared / f"plant-{plant}"
    base.mkdir()
    root = base / "root"
    i = start_index(wheels)
    try:
        a = build(root, i, EARLY)
        entry = entry_of(root, module(a))
        # The other user cannot write into the wheel home, nor into an entry, nor read the seals.
        tried = as_intruder(intruder, """
            import os, sys
            out = []
            for d in sys.argv[1:3]:
                try:
                    open(os.path.join(d, "evil.py"), "x").close()
                    out.append("created")
                except OSError as exc:
                    out.append(type(exc).__name__)
            try:
                os.listdir(sys.argv[3])
                out.append("listed")
            except OSError as exc:
                out.append(type(exc).__name__)
            print(" ".join(out))
        """, str(home(root)), str(entry / "tinyengine"), str(root / "var" / "wheels"))
        assert tried.stdout.split() == ["PermissionError"] * 3, tried.stderr
        # What they could only plant with root's help (a mistake, a shared container image):
        uid, gid = intruder.pw_uid, intruder.pw_gid
        if plant == "extra-file":
            os.chmod(entry / "tinyengine", 0o755)
            (entry / "tinyengine" / "evil.py").write_text("print('planted')\n")
            os.chown(entry / "tinyengine" / "evil.py", uid, gid)
            os.chmod(entry / "tinyengine", 0o555)
        elif plant == "file-owned-by-them":
            os.chown(entry / "tinyengine" / "__init__.py", uid, gid)
        else:
            (root / "var" / "wheels" / entry.name).unlink()
            subprocess.run(["chown", "-R", f"{uid}:{gid}", str(entry)], check=True)
        planted = home_inodes(root) & {ino(p) for p in entry.rglob("*")}
        proc = build_proc(root, i, LATE)
        assert proc.returncode == 0, proc.stderr
        b = Path(json.loads(proc.stdout)["path"])
        assert not (site(b) / "tinyengine" / "evil.py").exists()
        assert not {ino(p) for p in b.rglob("*") if p.is_file() and not p.is_symlink()} & planted
        assert all(os.lstat(p).st_uid == os.geteuid() for p in b.rglob("*"))
        assert not entry.exists()  # the planted entry left the wheel home
        code, r = verify(root, str(b))
        assert code == 0 and r["damaged"] == [], r
        assert runs(b) == "tinyengine 1.0 tinydep 2.0"
    finally:
        i.stop()
        subprocess.run(["chmod", "-R", "u+w", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


# --- RECORD: checked once, when an entry is sealed ----------------------------------------------

def test_an_entry_damaged_before_it_was_sealed_is_refused_and_unpacked_again(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    good = module(a).read_bytes()
    entry = entry_of(root, module(a))
    (root / "var" / "wheels" / entry.name).unlink()  # as if uv had just unpacked it
    tamper_in_place(entry / "tinyengine" / "__init__.py")
    proc = build_proc(root, idx, LATE)
    assert proc.returncode == 0, proc.stderr
    assert "is not what its wheel's RECORD lists" in proc.stderr and "tinyengine/__init__.py" in proc.stderr
    b = Path(json.loads(proc.stdout)["path"])
    assert module(b).read_bytes() == good and not entry.exists()
    assert verify(root, str(b))[0] == 0


def _lying_wheel(d: Path) -> Path:
    """tinyengine 1.0 whose RECORD gives its module another digest (the wheel's own sha256, which
    the lock pins, is still right: only the RECORD check can tell)."""
    w = build_wheel(d, "tinyengine", "1.0", requires=("tinydep",), scripts={"tinyengine": "tinyengine:main"})
    with zipfile.ZipFile(w) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    record = "tinyengine-1.0.dist-info/RECORD"
    wrong = base64.urlsafe_b64encode(hashlib.sha256(b"something else").digest()).rstrip(b"=").decode()
    members[record] = b"\n".join(
        (ln.split(b",")[0] + b",sha256=" + wrong.encode() + b"," + ln.split(b",")[2]) if ln.startswith(b"tinyengine/")
        else ln for ln in members[record].split(b"\n"))
    w.unlink()
    with zipfile.ZipFile(w, "w") as zf:
        for n, data in members.items():
            zf.writestr(zipfile.ZipInfo(n, (2024, 1, 1, 0, 0, 0)), data)
    return w


def test_a_wheel_whose_record_is_wrong_as_published_is_installed_as_uv_unpacks_it(tmp_path, wheels):
    """Real wheels ship wrong RECORD lines (pynvvideocodec 2.0.4, a vLLM dependency: two .so files).
    The lock's sha256 proves the wheel's bytes; the RECORD check proves only that the wheel home's
    entry is what uv unpacked. So the first mismatch evicts the entry and the build runs again; the
    same bytes unpacked the second time are the wheel's own, sealed as unpacked and said in one line."""
    i = PackageIndex()
    i.add("tinyengine", _lying_wheel(tmp_path / "w"), RELEASE_DATES["tinyengine-1.0"])
    i.add("tinydep", wheels["tinydep-1.0"], RELEASE_DATES["tinydep-1.0"])
    i.start()
    try:
        root = tmp_path / "root"
        proc = build_proc(root, i, EARLY)
    finally:
        i.stop()
    assert proc.returncode == 0, proc.stderr
    assert "is not what its wheel's RECORD lists" in proc.stderr  # the first time: evicted, built again
    assert "the wheel's RECORD is wrong for 1 file(s) (tinyengine/__init__.py)" in proc.stderr
    path = Path(json.loads(proc.stdout)["path"])
    assert run_in_env(path, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    assert verify(root, str(path))[0] == 0
    # both wheels sealed: the second one as uv unpacked it
    sealed = [home(root) / p.name for p in (root / "var" / "wheels").iterdir()]
    assert [e for e in sealed if (e / "tinyengine-1.0.dist-info").exists()]


# --- gc --------------------------------------------------------------------------------------------

def test_gc_removes_the_wheels_no_path_links_and_keeps_the_others(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    b = build(root, idx, LATE)
    run_cli(root, "activate", "p", str(a), check=True)
    own = entry_of(root, module(b, "tinydep"))  # tinydep 2.0: b's alone
    kept = {entry_of(root, module(a)), entry_of(root, module(a, "tinydep"))}
    size = sum(os.lstat(p).st_blocks * 512 for p in own.rglob("*"))
    plan = json.loads(run_cli(root, "--json", "gc", "--dry-run", check=True).stdout)
    r = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    assert [d["name"] for d in r["deleted"]] == [b.name]
    assert not own.exists() and not (root / "var" / "wheels" / own.name).exists()
    assert all(e.exists() and (root / "var" / "wheels" / e.name).exists() for e in kept)
    # uv's pointers to the removed archive went with it
    cache = root / "cache" / "uv"
    pointers = [os.readlink(Path(d, n)) for d, ds, ns in os.walk(cache) for n in ns + ds if Path(d, n).is_symlink()]
    assert not any(t.endswith("/" + own.name) for t in pointers)
    assert r["freed"]["store_paths"] >= size
    assert abs(plan["freed"]["store_paths"] - r["freed"]["store_paths"]) <= 0.05 * r["freed"]["store_paths"] + 65536
    # a still runs; b builds again (uv fetches tinydep 2.0 anew)
    assert runs(a) == "tinyengine 1.0 tinydep 1.0"
    assert runs(build(root, idx, LATE)) == "tinyengine 1.0 tinydep 2.0"


def test_gc_keeps_what_a_build_in_flight_has_linked(tmp_path, idx):
    root = tmp_path / "root"
    before: list[str] = []

    def collect() -> None:
        before.extend(sorted(p.name for p in home(root).iterdir()))
        assert len(before) == 2  # tinyengine and tinydep, linked into the .partial, not sealed yet
        run_cli(root, "gc", check=True)
        assert sorted(p.name for p in home(root).iterdir()) == before

    code, out, err = build_held(root, idx, EARLY, tmp_path, collect)
    assert code == 0, err
    assert runs(Path(json.loads(out)["path"])) == "tinyengine 1.0 tinydep 1.0"


def test_the_store_keeps_one_copy_of_each_wheel(tmp_path, idx):
    """Disk: the wheel home's files are the environment's inodes; uv's cache holds pointers only."""
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    run_cli(root, "activate", "p", str(a), check=True)
    run_cli(root, "gc", check=True)
    env_inodes = {ino(p) for p in a.rglob("*") if p.is_file() and not p.is_symlink()}
    others = {}
    for d, _, ns in os.walk(root):
        for n in ns:
            st = os.lstat(Path(d, n))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in env_inodes:
                others[(st.st_dev, st.st_ino)] = Path(d, n)
    wheel_files = {p for p in others.values() if home(root) in p.parents}
    # left in the wheel home and not in the environment: only what uv never links (each RECORD)
    assert {p.name for p in wheel_files} == {"RECORD"}
    assert not [p for p in others.values() if (root / "cache" / "uv") in p.parents and p.stat().st_size > 4096]


# --- an older store -------------------------------------------------------------------------------

def test_an_older_stores_uv_archives_move_into_the_wheel_home_and_are_linked(tmp_path, idx):
    root = tmp_path / "root"
    (root / "cache").mkdir(parents=True)
    os.chmod(root, 0o755)
    # what a store before the wheel home left: uv's cache with a real archive bucket, filled as its
    # builds filled it (a hashed lock, installed by copy)
    scratch = tmp_path / "venv"
    uv = str(real_uv())
    env = {**os.environ, "UV_CACHE_DIR": str(root / "cache" / "uv"), "UV_NO_CONFIG": "1"}
    (tmp_path / "req.in").write_text("tinyengine==1.0\n")
    subprocess.run([uv, "pip", "compile", "-q", str(tmp_path / "req.in"), "-o", str(tmp_path / "req.lock"),
                    "--generate-hashes", "--exclude-newer", EARLY, "--index-url", idx.url], check=True, env=env)
    subprocess.run([uv, "venv", "-q", str(scratch)], check=True, env=env)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(scratch / "bin" / "python"), "--index-url", idx.url,
                    "--require-hashes", "--no-deps", "-r", str(tmp_path / "req.lock"), "--link-mode", "copy"],
                   check=True, env=env)
    old = sorted(p.name for p in (root / "cache" / "uv" / "archive-v0").iterdir())
    assert len(old) == 2 and not (root / "cache" / "uv" / "archive-v0").is_symlink()
    a = build(root, idx, EARLY)
    # the old archives became the wheel home, and the environment links them: none was unpacked again
    assert sorted(p.name for p in home(root).iterdir()) == old
    assert entry_of(root, module(a)).name in old and entry_of(root, module(a, "tinydep")).name in old
    assert runs(a) == "tinyengine 1.0 tinydep 1.0" and verify(root)[0] == 0


def test_a_wheel_that_ships_bytecode_is_compiled_over_without_damage(tmp_path, wheels):
    """numpy 1.26's wheel ships a .pyc: the bytecode step renames its own over that name, a new file
    of the environment's, which is no edit of the wheel home's (found on a real transformers build)."""
    import sys

    shipped = f"tinyengine/__pycache__/__init__.{sys.implementation.cache_tag}.pyc"
    w = build_wheel(tmp_path / "w", "tinyengine", "1.0", requires=("tinydep",), scripts={"tinyengine": "tinyengine:main"},
                    extra_files={shipped: b"not bytecode"})
    i = PackageIndex()
    i.add("tinyengine", w, RELEASE_DATES["tinyengine-1.0"])
    i.add("tinydep", wheels["tinydep-1.0"], RELEASE_DATES["tinydep-1.0"])
    i.start()
    try:
        root = tmp_path / "root"
        a = build(root, i, EARLY)
        b = build(root, i, LATE)  # a second build checks the sealed entry, and links it again
    finally:
        i.stop()
    entry = entry_of(root, module(a))
    assert (entry / shipped).read_bytes() == b"not bytecode"  # the wheel home's copy, as the wheel has it
    for env in (a, b):
        pyc = site(env) / shipped
        assert pyc.read_bytes() != b"not bytecode" and ino(pyc) != ino(entry / shipped)
    assert runs(a) == "tinyengine 1.0 tinydep 1.0" and verify(root)[0] == 0
