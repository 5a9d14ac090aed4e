"""Bytecode on disk once (issue 33): once a path is registered, the bytecode cache's entries it used
or made are links to its own pycs (store inodes), never copies beside them; a reuse never changes a
store inode; gc takes a dead path's bytecode with it; the list the compile script hands over is
untrusted (bytecode.link_cache)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from llmgw_store.build.bytecode import link_cache
from tests.conftest import build_json, run_cli


def inodes(tree: Path) -> dict[tuple[int, int], int]:
    """(dev, ino) -> blocks in bytes of every regular file under `tree` (each inode once)."""
    out = {}
    for d, _, fs in os.walk(tree):
        for f in fs:
            st = os.lstat(os.path.join(d, f))
            if stat.S_ISREG(st.st_mode):
                out[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return out


def test_the_pyc_cache_adds_no_blocks_beyond_the_store(root, recipe, index, uv_bin):
    for as_of in ("2024-02-02", "2024-06-02"):  # the second reuses tinyengine's entry
        build_json(root, recipe, index, uv_bin, "--as-of", as_of)
        store, cache = inodes(root / "store"), inodes(root / "cache" / "pyc")
        assert len(cache) >= 2
        assert sum(blocks for ident, blocks in cache.items() if ident not in store) == 0


def test_a_reuse_never_changes_a_store_inode(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    pycs = {p: (os.lstat(p).st_mtime_ns, os.lstat(p).st_mode) for p in a.rglob("*.pyc")}
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), "--as-of", "2024-06-02",
                   check=True)
    assert "1 from the bytecode cache" in proc.stderr
    assert {p: (os.lstat(p).st_mtime_ns, os.lstat(p).st_mode) for p in pycs} == pycs
    assert run_cli(root, "verify").returncode == 0


def test_gc_takes_a_dead_paths_bytecode_with_it(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    pycs = {(os.lstat(p).st_dev, os.lstat(p).st_ino) for p in a.rglob("*.pyc")}
    assert pycs and pycs <= set(inodes(root / "cache" / "pyc"))
    plan = json.loads(run_cli(root, "--json", "gc", "--dry-run", check=True).stdout)
    done = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    assert [d["name"] for d in done["deleted"]] == [a.name]
    left = set(inodes(root / "cache" / "pyc")) | set(inodes(root / "store"))
    assert not pycs & left  # the cache's link and the pool's went with the path
    assert abs(plan["freed"]["store_paths"] - done["freed"]["store_paths"]) <= 65536


def _fake(tmp: Path, mode: int = 0o444) -> tuple[Path, Path, str, Path]:
    """An environment with one pyc and a cache holding a copy of it under an entry's name."""
    env, cache = tmp / "env", tmp / "cache"
    pyc = env / "lib" / "m" / "__pycache__" / "x.pyc"
    pyc.parent.mkdir(parents=True)
    pyc.write_bytes(b"bytecode" * 10)
    os.chmod(pyc, mode)
    name = "ab" + "1" * 62 + "." + "2" * 64 + ".pyc"
    shard = cache / "a70d0d0a" / "ab"
    shard.mkdir(parents=True)
    (shard / name).write_bytes(b"bytecode" * 10)
    return env, cache, f"a70d0d0a/ab/{name}\tlib/m/__pycache__/x.pyc\n", shard / name


def test_link_cache_links_a_frozen_store_file(tmp_path):
    env, cache, line, entry = _fake(tmp_path)
    (tmp_path / "links").write_text(line)
    assert link_cache(cache, env, tmp_path / "links") == 1
    assert os.lstat(entry).st_ino == os.lstat(env / "lib/m/__pycache__/x.pyc").st_ino
    assert link_cache(cache, env, tmp_path / "links") == 0  # already the same inode


def test_link_cache_refuses_what_the_list_should_not_name(tmp_path):
    env, cache, line, entry = _fake(tmp_path, mode=0o644)  # a writable file is no store inode
    bad = [line,
           line.replace("lib/m/", "lib/../m/"),  # a parent step
           line.replace("/ab/", "/cd/"),  # a shard that is not the entry's
           line.replace("\tlib", "\t/lib"),  # an absolute path
           line.replace(".pyc\n", ".py\n")]
    (tmp_path / "links").write_text("".join(bad) + "garbage\n")
    assert link_cache(cache, env, tmp_path / "links") == 0
    os.chmod(env / "lib/m/__pycache__/x.pyc", 0o444)
    # a link on the way (lib/m -> elsewhere) is never followed
    os.rename(env / "lib" / "m", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", env / "lib" / "m")
    (tmp_path / "links").write_text(line)
    assert link_cache(cache, env, tmp_path / "links") == 0
    assert os.lstat(entry).st_nlink == 1
    # an entry of another size is not replaced
    os.unlink(env / "lib" / "m")
    os.rename(tmp_path / "elsewhere", env / "lib" / "m")
    os.chmod(entry, 0o644)
    entry.write_bytes(b"other")
    assert link_cache(cache, env, tmp_path / "links") == 0 and entry.read_bytes() == b"other"


def test_the_compiler_runs_nothing_the_environment_installs(tmp_path):
    """The compiler holds the secret that tags bytecode cache entries. It runs in the environment's
    own interpreter, whose site-packages any wheel may put a .pth in (code run at every start with
    `site`): run with -I -S (bytecode.WORKER), none of it runs, so no wheel can read the secret and
    tag a poisoned entry for the next build. The modules are still compiled and cached."""
    import subprocess
    import sys
    import sysconfig

    from llmgw_store.build import bytecode

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = env / sysconfig.get_path("purelib", vars={"base": str(env)}).removeprefix(str(env) + "/")
    leak = tmp_path / "leak"
    (site / "zz-evil.pth").write_text(
        f"import os; s = os.environ.get({bytecode.SECRET_ENV!r}); s and open({str(leak)!r}, 'w').write(s)\n")
    (site / "mod.py").write_text("x = 1\n")
    secret = os.urandom(bytecode.SECRET_BYTES)
    (tmp_path / "cache").mkdir()

    def run(argv, what):
        return subprocess.run([str(a) for a in argv], env={**os.environ, bytecode.SECRET_ENV: secret.hex()},
                              capture_output=True, text=True, check=True).stdout

    modules, failed, reused = bytecode.compile_tree(env / "bin" / "python", env, tmp_path / "cache", run)
    assert not leak.exists()
    assert (modules, failed, reused) == (1, 0, 0) and list(site.glob("__pycache__/mod.*.pyc"))
    assert list((tmp_path / "cache").rglob("*.pyc"))  # the secret reached the compiler: the cache is used
    # the same .pth does run in a plain start of that interpreter: the attack is real
    subprocess.run([env / "bin" / "python", "-c", "pass"], env={**os.environ, bytecode.SECRET_ENV: "ab"}, check=True)
    assert leak.read_text() == "ab"
