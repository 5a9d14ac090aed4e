"""A private index's token (issue 22) reaches uv through its environment and the store's own index
queries through httpx auth, and nothing else: not a key, a manifest, a record, the index's memo
tables, a log, a progress or error line, the binary cache, nor a child's argv — which every local
user can read in /proc/<pid>/cmdline. A token rotation changes no key.

The index here is a private mirror (HTTP 401 without the token). A build is held at a barrier while
uv downloads from it (the index parks the download until the test lets it go), and the process
listing is taken then: by this test (root) and by a second local user (nobody, through setpriv).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_cmd, run_cli, start_index, write_recipe

# Fresh per run: the /proc scans below look for the token machine-wide, so another run of this
# suite on the same machine (another checkout) must not hold the same one.
TOKEN = "tok-" + secrets.token_hex(8)
ROTATED = "tok-" + secrets.token_hex(8)


@pytest.fixture
def mirror(wheels):
    idx = start_index(wheels)
    idx.require_auth("__token__", TOKEN)
    yield idx
    idx.stop()


def _with_token(url: str, token: str = TOKEN) -> str:
    return url.replace("http://", f"http://__token__:{token}@")


def _files_holding(top: Path, needle: str) -> list[str]:
    """Every file under `top` whose bytes hold `needle` (links not followed, nothing skipped)."""
    found = []
    for dirpath, _dirnames, filenames in os.walk(top):
        for f in filenames:
            p = os.path.join(dirpath, f)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as fh:
                if needle.encode() in fh.read():
                    found.append(p)
    return found


SCAN = """
import json, os, sys
needle, found = sys.stdin.buffer.read(), []  # not in argv: this scan is a process too
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for what in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                data = f.read()
        except OSError:
            continue  # not this user's to read
        if needle in data:
            found.append([int(pid), what, open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[0].decode()])
print(json.dumps(found))
"""


def _listing(as_nobody: bool) -> list[list]:
    argv = [sys.executable, "-I", "-c", SCAN]
    if as_nobody:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    return json.loads(subprocess.run(argv, input=TOKEN, capture_output=True, text=True, check=True,
                                     timeout=60).stdout)


@pytest.mark.parametrize("given", ["env", "flag"])
def test_a_token_is_nowhere_but_where_it_was_given(tmp_path, mirror, given):
    root, cache, keys = tmp_path / "root", tmp_path / "cache", tmp_path / "keys"
    recipe = write_recipe(tmp_path, 'version = "1.0"')  # as_of from the index: the store asks it too
    url = _with_token(mirror.url)
    args, env = (["--index-url", url], {}) if given == "flag" else ([], {"LLMGW_STORE_INDEX_URL": url})
    reached, go = mirror.hold_downloads()
    proc = subprocess.Popen(cli_cmd(root, "--json", "-v", "build", str(recipe), *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    try:
        assert reached.wait(120), "no download reached the index"
        mine = _listing(as_nobody=False)
        theirs = _listing(as_nobody=True) if os.geteuid() == 0 and shutil.which("setpriv") else None
    finally:
        go.set()
    out, err = proc.communicate(timeout=300)
    mirror.held = None
    assert proc.returncode == 0, err
    # Root sees the token in the store's own environment (env) or its own argv (flag): what the
    # user gave it. In a child, only in uv's environment (/proc/<pid>/environ: the owner's alone).
    store_pid = proc.pid
    assert {(pid, what) for pid, what, _ in mine if pid == store_pid} == {(store_pid, "environ" if given == "env" else "cmdline")}
    # Its children: uv (and the keeper that starts it, supervise/procs.py) hold it in their environment.
    children = [(what, exe) for pid, what, exe in mine if pid != store_pid]
    assert all(what == "environ" for what, _ in children), mine
    assert any(exe.endswith("-uv-0.13.9-bin/bin/uv") for _, exe in children), mine
    if theirs is not None:
        # A second local user: nothing, or (flag) the command line the user typed, and nothing else.
        assert [(pid, what) for pid, what, _ in theirs] == ([(store_pid, "cmdline")] if given == "flag" else [])
    doc = json.loads(out)
    assert TOKEN not in out and TOKEN not in err  # -v: every child's argv is shown, and holds no token

    run_cli(root, "keygen", "b", "--out", str(keys), check=True)
    run_cli(root, "push", doc["name"], "--to", f"file://{cache}", "--secret-key", str(keys / "b.secret"), check=True)
    assert _files_holding(root, TOKEN) == [] and _files_holding(cache, TOKEN) == []
    manifest = json.loads((Path(doc["path"]) / ".llmgw" / "manifest.json").read_text())
    assert manifest["inputs"]["index_url"] == mirror.url == manifest["index_url"]

    # A failed install writes uv's whole output to a log: no token there either.
    mirror.tamper("tinydep-2.0-py3-none-any.whl")
    failed = run_cli(root, "build", str(recipe), "--as-of", "2024-08-01T00:00:00Z", *args, env=env)
    assert failed.returncode == 1 and "full output:" in failed.stderr
    assert TOKEN not in failed.stderr and _files_holding(root, TOKEN) == []


def test_a_token_rotation_changes_no_key(tmp_path, mirror):
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    first = json.loads(run_cli(tmp_path / "a", "--json", "build", str(recipe), "--index-url", _with_token(mirror.url),
                               check=True).stdout)
    mirror.require_auth("__token__", ROTATED)
    refused = run_cli(tmp_path / "b", "build", str(recipe), "--index-url", _with_token(mirror.url))
    assert refused.returncode == 1 and "refused the request (HTTP 401)" in refused.stderr
    assert "netrc" in refused.stderr and TOKEN not in refused.stderr
    again = json.loads(run_cli(tmp_path / "a", "--json", "build", str(recipe), "--index-url",
                               _with_token(mirror.url, ROTATED), check=True).stdout)
    assert again["key"] == first["key"] and again["how"] == "hit"
    fresh = json.loads(run_cli(tmp_path / "c", "--json", "build", str(recipe), "--index-url",
                               _with_token(mirror.url, ROTATED), check=True).stdout)
    assert fresh["key"] == first["key"] and fresh["how"] == "built"
    # No token, or one the mirror refuses, is the plain URL's key all the same: the URL, not a secret.
    plain = run_cli(tmp_path / "a", "--json", "build", str(recipe), "--index-url", mirror.url, check=True)
    assert json.loads(plain.stdout)["key"] == first["key"]


def test_netrc_gives_the_token_to_uv_and_to_the_store(tmp_path, mirror):
    """The URL stays plain everywhere, the token lives in a netrc file (NETRC), read by uv itself
    and by the store's own index queries; a repair from private caches reads it as well."""
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login __token__ password {TOKEN}\n")
    netrc.chmod(0o600)
    root = tmp_path / "root"
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    env = {"NETRC": str(netrc)}
    doc = json.loads(run_cli(root, "--json", "build", str(recipe), "--index-url", mirror.url, env=env,
                             check=True).stdout)
    # verify --repair rebuilds with private, empty caches: every wheel comes from the mirror again.
    target = next(Path(doc["path"]).glob("lib/python*/site-packages/tinydep/__init__.py"))
    os.chmod(target.parent, 0o755)
    os.chmod(target, 0o644)
    target.write_text("raise SystemExit('tampered')\n")
    without = run_cli(root, "verify", "--repair", doc["name"])
    assert without.returncode == 1
    repaired = run_cli(root, "--json", "verify", "--repair", doc["name"], env=env)
    assert repaired.returncode == 0, repaired.stderr
    assert json.loads(repaired.stdout)["paths"][0]["repair"]["identical"] is True
    assert _files_holding(root, TOKEN) == []


def test_a_netrc_others_can_read_is_refused_for_the_index_as_for_a_cache(tmp_path, mirror):
    """One netrc rule for every request the store makes (app/credentials.netrc_login): a netrc
    file others can read is refused by the index's queries as by a cache's (test_nginx_cache), with
    one line that names the file and not the token."""
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login __token__ password {TOKEN}\n")
    netrc.chmod(0o644)
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    loose = run_cli(tmp_path / "root", "build", str(recipe), "--index-url", mirror.url, env={"NETRC": str(netrc)})
    assert loose.returncode != 0 and "private to it (chmod 600)" in loose.stderr, loose.stderr
    assert str(netrc) in loose.stderr and TOKEN not in loose.stderr + loose.stdout
    netrc.chmod(0o600)
    run_cli(tmp_path / "root", "build", str(recipe), "--index-url", mirror.url, env={"NETRC": str(netrc)}, check=True)


def test_the_configured_url_lends_its_token_to_a_repair_of_the_same_index(tmp_path, mirror):
    root = tmp_path / "root"
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    url = _with_token(mirror.url)
    doc = json.loads(run_cli(root, "--json", "build", str(recipe), env={"LLMGW_STORE_INDEX_URL": url},
                             check=True).stdout)
    target = Path(doc["path"]) / "bin" / "tinyengine"
    os.chmod(target.parent, 0o755)
    os.chmod(target, 0o755)
    target.write_text("#!/bin/sh\necho tampered\n")
    # Another index's token is not sent to the recorded one: the repair is refused (401).
    other = run_cli(root, "verify", "--repair", doc["name"],
                    env={"LLMGW_STORE_INDEX_URL": "http://__token__:x@127.0.0.2:1/simple"})
    assert other.returncode == 1
    ok = run_cli(root, "--json", "verify", "--repair", doc["name"], env={"LLMGW_STORE_INDEX_URL": url})
    assert ok.returncode == 0, ok.stderr
    assert _files_holding(root, TOKEN) == []


def test_a_recipe_with_a_token_in_its_extra_index_is_refused(tmp_path):
    """A recipe's build table is a key input, recorded and pushed: a token there would be too."""
    recipe = write_recipe(tmp_path, f'extra_index = "https://__token__:{TOKEN}@mirror.internal/whl"\n'
                                    'index_packages = ["tinydep"]\nversion = "1.0"')
    proc = run_cli(tmp_path / "root", "build", str(recipe))
    assert proc.returncode == 2 and "extra_index: holds credentials" in proc.stderr
    assert TOKEN not in proc.stderr and not (tmp_path / "root" / "store").exists()
