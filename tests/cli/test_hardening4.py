"""The fourth round of hardening (issue 32): each attack on a store that runs as root on a shared
node, with the honest case beside it.

- an inline trusted key whose base64 holds `/` is a key, never a path another user planted; a key
  file is named by an absolute path (or, in the config file, relative to its directory) and held to
  the config file's trust rule wherever it is named;
- the fast path checks the files its cached config values name (uv, key files) as the full command
  does;
- a config file nested deep is a config error (exit 2, a JSON document), not a traceback;
- the shipped uv is checked against pip's RECORD before it is ever run;
- a service user whose HOME is root's reads no config file there (a missing file), unless named.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from llmgw_store.base.errors import IntegrityError, UsageError
from llmgw_store.cache import signing
from tests.conftest import cli_cmd
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files are made with chown, as root")


def _key_with_a_slash(name: str = "builder") -> tuple[object, str]:
    """A signing key whose public key's base64 holds a `/` (about half of them do)."""
    from nacl.signing import SigningKey

    while True:
        sk = SigningKey.generate()
        b64 = base64.b64encode(bytes(sk.verify_key)).decode()
        if "/" in b64.rstrip("=")[1:]:
            return sk, f"{name}:{b64}"


def _signed(sk, name: str) -> dict:
    from nacl.signing import SigningKey

    meta = {"key": "k" * 32, "name": "x"}
    sig = SigningKey(bytes(sk)).sign(signing.signed_part(meta)).signature
    meta["signatures"] = [{"key": name, "sig": base64.b64encode(sig).decode()}]
    return meta


def _sticky(tmp_path: Path) -> Path:
    """A root-owned sticky directory every user may write (a shared scratch directory, as /tmp)."""
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


def _plant(shared: Path, relative: str, text: str, uid: int = NOBODY) -> Path:
    """What another user makes in the shared directory: `relative` (directories and all), theirs."""
    target = shared / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    p = target
    while p != shared:
        os.chown(p, uid, uid)
        p = p.parent
    return target


# --- another user's key becomes trusted --------------------------------------------------------

@needs_root
@pytest.mark.parametrize("via", ["flag", "variable"])
def test_an_inline_key_with_a_slash_is_never_read_as_a_path(tmp_path, monkeypatch, via):
    """Run from a shared sticky directory where another user made `builder:AB/CD=` (the trusted
    key's own text as a path) holding their public key: the value is the key, their file is never
    read, and what they sign is refused."""
    real, value = _key_with_a_slash()
    intruder, _ = _key_with_a_slash()
    shared = _sticky(tmp_path)
    planted = _plant(shared, value, f"builder:{base64.b64encode(bytes(intruder.verify_key)).decode()}\n")
    assert planted.is_file()
    monkeypatch.chdir(shared)
    if via == "flag":
        trusted = signing.trusted_keys([value])
    else:
        monkeypatch.setenv("LLMGW_STORE_TRUSTED_KEYS", value)
        trusted = signing.trusted_keys([])
    assert trusted == {"builder": bytes(real.verify_key)}
    with pytest.raises(IntegrityError, match="not signed by a trusted key"):
        signing.check_signature(_signed(intruder, "builder"), trusted, "k")
    assert signing.check_signature(_signed(real, "builder"), trusted, "k") == "builder"


def _refused(values, *fragments, env: str | None = None, monkeypatch=None) -> str:
    if env is not None:
        monkeypatch.setenv("LLMGW_STORE_TRUSTED_KEYS", env)
    with pytest.raises(UsageError) as caught:
        signing.trusted_keys(values)
    for f in fragments:
        assert f in str(caught.value), (f, str(caught.value))
    return str(caught.value)


@needs_root
def test_a_key_file_is_held_to_the_config_files_trust_rule(tmp_path, monkeypatch):
    """A key file by flag or variable: only by an absolute path, and only one no other user could
    have written (the file, the directories above it, the links on the way); the honest file, and a
    link to it from a trusted directory, are read."""
    real, value = _key_with_a_slash()
    keys = tmp_path / "keys"
    keys.mkdir()
    good = keys / "builder.public"
    good.write_text(value + "\n")
    good.chmod(0o644)
    assert signing.trusted_keys([str(good)]) == {"builder": bytes(real.verify_key)}
    link = keys / "current.public"
    link.symlink_to(good)
    assert signing.trusted_keys([str(link)]) == {"builder": bytes(real.verify_key)}
    monkeypatch.setenv("LLMGW_STORE_TRUSTED_KEYS", str(good))
    assert signing.trusted_keys([]) == {"builder": bytes(real.verify_key)}
    monkeypatch.delenv("LLMGW_STORE_TRUSTED_KEYS")

    # Relative: never looked up in the current directory (another user's, perhaps).
    monkeypatch.chdir(keys)
    _refused(["builder.public"], "absolute path")
    _refused([], "absolute path", "LLMGW_STORE_TRUSTED_KEYS", env="builder.public", monkeypatch=monkeypatch)
    monkeypatch.delenv("LLMGW_STORE_TRUSTED_KEYS")
    # Another user's file, in a directory of ours.
    theirs = keys / "theirs.public"
    theirs.write_text(value + "\n")
    os.chown(theirs, NOBODY, NOBODY)
    _refused([str(theirs)], str(theirs), "owned by uid 65534")
    # Our file, writable by others.
    loose = keys / "loose.public"
    loose.write_text(value + "\n")
    loose.chmod(0o666)
    _refused([str(loose)], "writable by other users")
    # Our file, in a directory another user owns (they can swap it), via the variable too.
    shared = _sticky(tmp_path)
    inside = _plant(shared, "their-dir/builder.public", value + "\n")
    os.chown(inside, 0, 0)
    _refused([], str(inside), "owned by uid 65534", env=str(inside), monkeypatch=monkeypatch)
    monkeypatch.delenv("LLMGW_STORE_TRUSTED_KEYS")
    # A link in another user's directory, to our good file.
    their_link = shared / "their-dir" / "link.public"
    their_link.symlink_to(good)
    os.lchown(their_link, NOBODY, NOBODY)
    _refused([str(their_link)], "owned by uid 65534")
    # A link in our directory, leading into theirs: the walk goes on through their directory.
    into = keys / "into.public"
    into.symlink_to(inside)
    _refused([str(into)], "owned by uid 65534")
    # A directory, or a FIFO, is no key file (and is never waited on).
    _refused([str(keys)], "not a regular file")
    os.mkfifo(keys / "fifo.public")
    _refused([str(keys / "fifo.public")], "not a regular file")
    # Neither a key nor an absolute path: one message saying both.
    _refused(["builder:AAAA"], "name:base64", "absolute path")


def _config(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o644)
    return path


def _cli(config: Path, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    argv = [cli_cmd(Path("/"))[0], *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
                          env={**os.environ, "LLMGW_STORE_CONFIG": str(config), **(env or {})})


@needs_root
def test_a_relative_key_file_in_the_config_is_the_config_directorys_and_trusted(tmp_path, monkeypatch):
    """`trusted_keys = ["keys/b.public"]` is the file beside the config, whatever the current
    directory; it is trust-checked as `uv` is; a key inline stays a key."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real, value = _key_with_a_slash()
    etc = tmp_path / "etc"
    (etc / "keys").mkdir(parents=True)
    (etc / "keys" / "b.public").write_text(value + "\n")
    conf = _config(etc / "config.toml", f'trusted_keys = ["keys/b.public", "{value}"]\n')
    # Run from a shared directory where another user planted keys/b.public of their own.
    shared = _sticky(tmp_path)
    _plant(shared, "keys/b.public", "builder:" + base64.b64encode(b"\1" * 32).decode() + "\n")
    proc = _cli(conf, "--json", "config", cwd=shared)
    assert proc.returncode == 0, proc.stderr
    shown = json.dumps(json.loads(proc.stdout))
    assert str(etc / "keys" / "b.public") in shown and str(shared) not in shown
    # The file beside the config, once another user owns its directory: refused, exit 2.
    os.chown(etc / "keys", NOBODY, NOBODY)
    proc = _cli(conf, "--json", "config", cwd=shared)
    assert proc.returncode == 2 and "trusted_keys" in proc.stderr and "owned by uid 65534" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["error"]


# --- the fast path runs a uv the full command refuses ------------------------------------------

def _traced(config: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, bool]:
    """The installed command, and whether the fast path answered (click was never imported)."""
    import sys

    argv = [sys.executable, "-X", "importtime", cli_cmd(Path("/"))[0], *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "LLMGW_STORE_CONFIG": str(config), **(env or {})})
    loaded = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    proc.stderr = "".join(ln + "\n" for ln in proc.stderr.splitlines() if not ln.startswith("import time:"))
    return proc, "click" not in loaded


def test_the_fast_path_checks_the_uv_its_cached_config_names(tmp_path, monkeypatch, index, uv_bin):
    """The config's uv passes when the full command caches the file's values; then its directory
    becomes writable by others and the binary is replaced. Both parsers refuse it (exit 2, naming
    it), and the replacement never runs."""
    from tests.support.recipes import write_recipe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tools = tmp_path / "tools"
    tools.mkdir()
    uv = tools / "uv"
    uv.write_bytes(uv_bin.read_bytes())
    uv.chmod(0o755)
    root = tmp_path / "node"
    conf = _config(tmp_path / "node.toml", f'root = "{root}"\nindex_url = "{index.url}"\nuv = "{uv}"\n')
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    # The honest case: the full command caches the values, the fast path then answers.
    assert _cli(conf, "config").returncode == 0
    assert _cli(conf, "activate", "p", str(recipe)).returncode == 0
    proc, fast = _traced(conf, "activate", "p", str(recipe))
    assert proc.returncode == 0 and fast and "already at generation 1" in proc.stdout, proc.stderr
    other = write_recipe(tmp_path, 'version = "1.0"', name="other.toml").read_text()
    (tmp_path / "other.toml").write_text(other.replace('name = "tiny"', 'name = "tiny2"', 1))

    # Another user may now write uv's directory, and swaps the binary for a script.
    ran = tmp_path / "ran"
    tools.chmod(0o777)
    uv.unlink()
    uv.write_text(f"#!/bin/sh\necho ran >> {ran}\nexec {uv_bin} \"$@\"\n")
    uv.chmod(0o755)
    full = _cli(conf, "config")
    assert full.returncode == 2 and "writable by other users" in full.stderr and "uv" in full.stderr, full.stderr
    for args in (["activate", "p", str(recipe)], ["activate", "q", str(tmp_path / "other.toml")],
                 ["build", str(recipe), "--as-of", "2024-06-02"]):
        proc = _cli(conf, *args)
        assert proc.returncode == 2 and "writable by other users" in proc.stderr, (args, proc.stderr)
    assert not ran.exists()


# --- a deep config file is a traceback -----------------------------------------------------------

DEEP = 3000


@pytest.mark.parametrize("text", [
    "lock_timeout = " + "[" * DEEP + "]" * DEEP + "\n",
    "substituters = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n",
    "lock_timeout." + ".".join(["a"] * DEEP) + " = 1\n",
    "[gc]\nkeep = " + "[" * 200 + "]" * 200 + "\n",
    # A multi-line string closed by a run of 4 quotes desynchronised the one-pass pre-check
    # (6-10 s of tomllib per command).
    'y = """x""""\nlock_timeout.' + ".".join(["a"] * 30_000) + " = 1\n",
    "y = '''x''''\nlock_timeout." + ".".join(["a"] * 30_000) + " = 1\n",
], ids=["arrays", "inline-tables", "dotted-keys", "shallower", "after-basic-quotes", "after-literal-quotes"])
def test_a_deep_config_file_is_a_config_error(tmp_path, monkeypatch, text):
    """Nested thousands deep (arrays, inline tables, dotted keys): one line, exit 2, and a JSON
    document under --json, from every command and both parsers; the same values shallow are read."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    conf = _config(tmp_path / "config.toml", text)
    for args in (["list"], ["config"], ["activate", "p", "/x"], ["build", "r.toml"]):
        proc = _cli(conf, *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("llmgw-store: error: ") and str(conf) in lines[0], proc.stderr
        proc = _cli(conf, "--json", *args)
        assert proc.returncode == 2 and json.loads(proc.stdout)["error"], (args, proc.stdout, proc.stderr)


def test_a_config_file_nested_as_deep_as_a_setting_needs_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    conf = _config(tmp_path / "config.toml", 'substituters = ["file:///x"]\n[gc]\nkeep = 3\n[cache]\nattempts = 2\n')
    proc = _cli(conf, "--json", "config")
    assert proc.returncode == 0, proc.stderr
    assert "file:///x" in proc.stdout


# --- the shipped uv may run before it is checked -----------------------------------------------

def _planted_uv_dist(tmp: Path, real: Path, counter: Path) -> tuple[Path, Path, bytes]:
    """A `uv` distribution of the pinned version (as test_uv_bootstrap's): its RECORD lists the
    real binary's digest, and its bin/uv starts as the real binary. Returns (site, bin/uv, the
    same-size script that counts its runs in `counter`, then runs the real uv)."""
    import hashlib

    from llmgw_store.build.uv import UV_VERSION

    data = real.read_bytes()
    site, bindir = tmp / "site", tmp / "bin"
    (site / "uv").mkdir(parents=True)
    bindir.mkdir()
    binary = bindir / "uv"
    binary.write_bytes(data)
    binary.chmod(0o755)
    (site / "uv" / "__init__.py").write_text(f"def find_uv_bin():\n    return {str(binary)!r}\n")
    info = site / f"uv-{UV_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: uv\nVersion: {UV_VERSION}\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"../bin/uv,sha256={digest},{len(data)}\nuv/__init__.py,,\n")
    script = f"#!/bin/sh\necho ran >> {counter}\nexec {real} \"$@\"\n#".encode()
    script += b"x" * (len(data) - len(script))
    assert len(script) == len(data)
    return site, binary, script


def _replace_in_place(binary: Path, script: bytes) -> None:
    """Overwrite the binary's bytes (same inode, same size) and put its mtime back."""
    st = binary.stat()
    with open(binary, "r+b") as f:
        f.write(script)
    os.utime(binary, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_shipped_uv_is_checked_against_its_record_before_it_ever_runs(tmp_path, index, uv_bin):
    """pip's uv replaced in place by a same-size script (its mtime put back): no command runs it —
    not a substitute-only build (which asks the shipped binary its --version and finds an
    interpreter with it), not a build (which copies it), not gc's `uv cache prune` — on fresh
    roots and on a root whose store uv was made before; each fresh root refuses it naming RECORD."""
    from tests.support.recipes import write_recipe

    counter = tmp_path / "runs"
    site, binary, script = _planted_uv_dist(tmp_path / "dist", uv_bin, counter)
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    recipe = write_recipe(tmp_path, 'version = "1.0"\nas_of = "2024-02-02"')
    key = "k:" + base64.b64encode(b"\1" * 32).decode()
    only = ["--substitute-only", "--substituter", f"file://{tmp_path / 'empty'}", "--trusted-key", key]

    def cli(root: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(cli_cmd(root, *args), capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, **env})

    # The honest binary: a store uv copied from it, and a substitute-only miss on a fresh root.
    existing = tmp_path / "existing"
    assert cli(existing, "build", str(recipe), "--index-url", index.url).returncode == 0
    honest = cli(tmp_path / "honest", "build", str(recipe), *only)
    assert honest.returncode == 66 and "no binary cache has" in honest.stderr, honest.stderr
    # A root built with --uv whose uv cache has its own archive directory (an older store's):
    # gc --max-cache prunes it with `uv cache prune`, run by the shipped binary.
    pruned = tmp_path / "pruned"
    assert cli(pruned, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin)).returncode == 0
    bucket = pruned / "cache" / "uv" / "archive-v0"
    if bucket.is_symlink():
        bucket.unlink()
        bucket.mkdir()
    assert not counter.exists()  # the honest binary ran, but not through the counting script

    _replace_in_place(binary, script)
    for n, args in enumerate([("build", str(recipe), *only), ("build", str(recipe), *only),
                              ("build", str(recipe), "--index-url", index.url)]):
        proc = cli(tmp_path / f"fresh-{n}", *args)
        assert proc.returncode == 1 and "RECORD" in proc.stderr, (args, proc.stderr)
        assert not counter.exists(), (args, counter.read_text())
    proc = cli(pruned, "gc", "--max-cache", "1G")
    assert "RECORD" in proc.stderr, proc.stderr
    # The root whose store uv was made from the honest binary runs its own copy.
    proc = cli(existing, "build", str(recipe), "--as-of", "2024-03-03", "--index-url", index.url)
    assert proc.returncode == 0, proc.stderr
    proc = cli(existing, "build", str(recipe), "--as-of", "2024-04-04", *only)
    assert proc.returncode == 66 and "no binary cache has" in proc.stderr, proc.stderr
    assert cli(existing, "gc", "--max-cache", "1G").returncode == 0
    assert not counter.exists(), counter.read_text()


# --- a service user without its own HOME -----------------------------------------------------------

@pytest.fixture(scope="module")
def served(wheels, uv_bin):
    """A store other users read, with profile p at tinyengine 1.0, and a service user."""
    from tests.conftest import start_index, write_recipe
    from tests.support.users import local_user, system_python, traversable_dir

    if system_python() is None:
        pytest.skip("no world-runnable python on this machine: the environment is root's alone")
    idx = start_index(wheels)
    try:
        with traversable_dir("llmgw-h4-") as shared, local_user("llmgwh4") as user:
            root = shared / "root"
            recipe = write_recipe(shared, 'version = "1.0"')
            env = {**os.environ, "LLMGW_STORE_PYTHON_PREFERENCE": "only-system", "LLMGW_STORE_CONFIG": ""}
            subprocess.run(cli_cmd(root, "build", str(recipe), "--index-url", idx.url, "--uv", str(uv_bin),
                                   "--as-of", "2024-02-02"), check=True, capture_output=True, env=env, timeout=300)
            subprocess.run(cli_cmd(root, "activate", "p", str(recipe), "--index-url", idx.url, "--uv", str(uv_bin),
                                   "--as-of", "2024-02-02"), check=True, capture_output=True, env=env, timeout=300)
            yield {"root": root, "user": user, "shared": shared}
    finally:
        idx.stop()


@needs_root
@pytest.mark.parametrize("home", ["root", "another-user", "another-users-open-home"])
def test_a_service_user_with_roots_home_runs_readers(served, home):
    """`runuser`/`setpriv` keep HOME: the implicit config file under a home the service user may not
    enter is no file for `run` and `env` (one line under -v); named by --config or the variable it
    is still an error, and a command that is not a reader still says why."""
    from tests.support.users import cli_as

    root, user = served["root"], served["user"]
    if home == "root":
        homedir = Path("/root")
        if os.stat(homedir).st_mode & 0o001:
            pytest.skip("/root lets other users through here")
    else:
        homedir = served["shared"] / "alice"
        homedir.mkdir(exist_ok=True)
        homedir.chmod(0o755 if home == "another-users-open-home" else 0o700)
        os.chown(homedir, NOBODY, NOBODY)
    implicit = homedir / ".config" / "llmgw-store" / "config.toml"
    env = {"HOME": str(homedir)}
    ran = cli_as(user, root, "run", "p", "--", "tinyengine", env=env)
    assert ran.returncode == 0 and "tinyengine 1.0" in ran.stdout, ran.stderr
    assert ran.stderr == ""
    lines = cli_as(user, root, "env", "p", env=env)
    assert lines.returncode == 0 and "export VIRTUAL_ENV=" in lines.stdout, lines.stderr
    told = cli_as(user, root, "-v", "env", "p", env=env)
    assert told.returncode == 0, told.stderr
    said = [ln for ln in told.stderr.splitlines() if str(implicit) in ln]
    assert len(said) == 1 and "no config file" in said[0], told.stderr
    # Named, it must be read.
    for named in (["--config", str(implicit)], []):
        extra = {} if named else {"LLMGW_STORE_CONFIG": str(implicit)}
        proc = cli_as(user, root, *named, "run", "p", "--", "tinyengine", env={**env, **extra})
        assert proc.returncode == 2 and str(implicit) in proc.stderr, proc.stderr
    # Not a reader: the config file it cannot read is still an error.
    proc = cli_as(user, root, "stats", env=env)
    assert proc.returncode == 2 and str(implicit) in proc.stderr, proc.stderr


@pytest.mark.parametrize("opened", ["directory", "link"])
def test_the_fast_path_checks_the_key_files_its_cached_config_names(tmp_path, monkeypatch, opened):
    """A key file named by the config (relative: the config's directory's), cached by the full
    command; then its directory opens up to others (or the name becomes a link planted in a
    directory others may write): the cached values are not used."""
    from llmgw_store.cli import config

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _, value = _key_with_a_slash()
    etc = tmp_path / "etc"
    (etc / "keys").mkdir(parents=True)
    (etc / "keys" / "b.public").write_text(value + "\n")
    conf = _config(etc / "config.toml", 'trusted_keys = ["keys/b.public"]\nlock_timeout = 7\n')
    assert _cli(conf, "config").returncode == 0
    environ = {**os.environ, "LLMGW_STORE_CONFIG": str(conf)}
    known, values = config.read_cached(None, environ)
    assert known and values["trusted_keys"] == (str(etc / "keys" / "b.public"),) and values["lock_timeout"] == 7
    if opened == "directory":
        (etc / "keys").chmod(0o777)
    else:
        loose = tmp_path / "loose"
        loose.mkdir()
        loose.chmod(0o777)
        (loose / "b.public").write_text(value + "\n")
        (etc / "keys").rename(etc / "old-keys")
        (etc / "keys").symlink_to(loose)
    assert config.read_cached(None, environ) == (False, {})
    assert _cli(conf, "config").returncode == 2


# --- the shipped uv is checked, then run by its path ---------------------------------------------

@needs_root
@pytest.mark.parametrize("whose", ["another-users-file", "another-users-directory", "an-open-directory", "roots"])
def test_a_shipped_uv_another_user_could_change_is_never_run(tmp_path, index, uv_bin, whose):
    """A shipped uv whose bytes are the recorded ones, but in a file (or a directory) another user
    may write: between its hash and its run that user could swap its bytes, so it is refused (one
    line, exit 2, naming the file) and never run, by a substitute-only build (which runs it by its
    path) and by a build (which copies it); root's own file is run."""
    from tests.support.recipes import write_recipe

    counter = tmp_path / "runs"
    site, binary, script = _planted_uv_dist(tmp_path / "dist", uv_bin, counter)
    # The counting script is what pip "installed": RECORD lists its digest, so the hash check
    # passes and only the trust rule stands between it and a run.
    import hashlib

    binary.write_bytes(script)
    record = next(site.glob("uv-*.dist-info")) / "RECORD"
    digest = base64.urlsafe_b64encode(hashlib.sha256(script).digest()).rstrip(b"=").decode()
    record.write_text(f"../bin/uv,sha256={digest},{len(script)}\nuv/__init__.py,,\n")
    if whose == "another-users-file":
        os.chown(binary, NOBODY, NOBODY)
    elif whose == "another-users-directory":
        os.chown(binary.parent, NOBODY, NOBODY)
    elif whose == "an-open-directory":
        binary.parent.chmod(0o777)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    recipe = write_recipe(tmp_path, 'version = "1.0"\nas_of = "2024-02-02"')
    key = "k:" + base64.b64encode(b"\1" * 32).decode()
    only = ["--substitute-only", "--substituter", f"file://{tmp_path / 'empty'}", "--trusted-key", key]
    for n, args in enumerate([("build", str(recipe), *only), ("build", str(recipe), "--index-url", index.url)]):
        proc = subprocess.run(cli_cmd(tmp_path / f"root-{n}", *args), capture_output=True, text=True, timeout=300,
                              check=False, env=env)
        if whose == "roots":
            assert proc.returncode == (66 if n == 0 else 0), (args, proc.stderr)
            assert counter.exists()
            continue
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and str(binary) in lines[0] and "uv" in lines[0], proc.stderr
        assert not counter.exists(), (args, counter.read_text())


# --- recipes are parsed without a bound ----------------------------------------------------------

@pytest.mark.parametrize("text,why", [
    ("[x]\n" + ".".join(["a"] * 30_000) + " = 1\n", "dotted key of more than"),
    ("[engine]\nname = " + "[" * 3000 + "]" * 3000 + "\n", "nested deeper than"),
    ('y = """x""""\nz.' + ".".join(["a"] * 30_000) + " = 1\n", "dotted key of more than"),
    ("# " + "x" * 70_000 + "\n", "larger than 64 KiB"),
], ids=["dotted-key", "arrays", "after-quotes", "too-large"])
def test_a_hostile_recipe_is_a_recipe_error(tmp_path, text, why):
    """A recipe with a dotted key of 30,000 parts (15 s of parsing), 3,000 nested arrays (was
    `internal error: RecursionError`, exit 1) or of 70 KB: one line naming the file and why, exit
    2, and a JSON document under --json; an ordinary recipe beside it is read (a substitute-only
    miss, exit 66)."""
    from tests.support.recipes import write_recipe

    hostile = tmp_path / "hostile.toml"
    hostile.write_text(text)
    key = "k:" + base64.b64encode(b"\1" * 32).decode()
    only = ["--substitute-only", "--substituter", f"file://{tmp_path / 'empty'}", "--trusted-key", key]
    root = tmp_path / "root"
    proc = subprocess.run(cli_cmd(root, "build", str(hostile), *only), capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and str(hostile) in lines[0] and why in lines[0], proc.stderr
    proc = subprocess.run(cli_cmd(root, "--json", "build", str(hostile), *only), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2 and why in json.loads(proc.stdout)["error"]["message"], (proc.stdout, proc.stderr)
    honest = write_recipe(tmp_path, 'version = "1.0"\nas_of = "2024-02-02"')
    proc = subprocess.run(cli_cmd(root, "build", str(honest), *only), capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 66 and "no binary cache has" in proc.stderr, proc.stderr


# --- push --drop-signature takes any text ------------------------------------------------------------

@pytest.mark.parametrize("bad", ["../x", "a/b", "", "x\n", "-x", "k" * 200])
def test_a_dropped_signatures_name_is_checked_as_a_key_name(world, tmp_path, bad):
    """`push --drop-signature ../x` was `already there`, silently: a name that is no signing key's
    is one line, exit 2, and nothing is written to the cache; a key's name beside it is dropped."""
    from tests.conftest import run_cli

    w, name = world, world["names"][0]
    cache = tmp_path / "cache"
    push = ["push", name, "--to", f"file://{cache}", "--secret-key", str(w["keys"] / "builder-1.secret")]
    proc = run_cli(w["root"], *push, "--drop-signature", bad)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "--drop-signature" in lines[0] and "signing key name" in lines[0], proc.stderr
    assert not cache.exists() or not any(cache.iterdir())
    proc = run_cli(w["root"], *push, "--drop-signature", "builder-0")
    assert proc.returncode == 0, proc.stderr
