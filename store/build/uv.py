"""The uv the store builds with, and the one way the store runs it.

The store pins one uv version (`UV_VERSION`, also pinned in pyproject.toml, so the `uv` package
installed beside llmgw-store ships that binary). By default the store copies that shipped binary
into a store path of its own (`<key>-uv-<version>-bin`) — checked against the digest pip recorded
for it and by its own `--version` — and only where it is missing (or another version) downloads
uv's PyPI wheel, checked against the sha256 the index publishes. Either way the store path's bytes
are the same (the wheel's `uv-<version>.data/scripts/uv` is what pip installed), and builds run
the copy: immutable, the store's, the version the key names, whatever later happens to the
Python environment llmgw-store is installed in (docs/design-notes.md says why it is copied).
`--uv PATH` names an existing binary instead, and then that binary's own `--version` is what
enters every key. A command that never builds (`--substitute-only`) does not make the store path:
it asks the shipped binary itself (its version memoised by its file stamp, like `--uv`).

Every uv run goes through `run`: a clean environment (no inherited UV_*, PIP_*, VIRTUAL_ENV, so a
user's uv.toml or pip.conf cannot change a build), paths as strings, the command shown with -v,
output captured; on failure the whole output goes to a log under ROOT/var/log and the error names it.
`run` starts its child through procs.run, which kills the child's whole process group when the
run ends, however it ends, and when the store process dies (issue 12).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw_store.app import network
from llmgw_store.app.credentials import IndexAuth
from llmgw_store.base.errors import CommandError, IntegrityError, UnsafePathError, UsageError
from llmgw_store.base.report import say
from llmgw_store.core.index import file_stamp
from llmgw_store.core.keys import SCHEMA_VERSION, path_name, store_key
from llmgw_store.system.host import platform_facts

if TYPE_CHECKING:
    from llmgw_store.core.local_store import Store

UV_VERSION = "0.13.9"
# Variables passed through to uv and verify commands; everything else is dropped.
# NETRC: uv reads a private index's credentials from that file itself (app/credentials.py).
PASS_ENV = (
    "PATH", "HOME", "LANG", "LC_ALL", "TERM", "SSL_CERT_FILE", "SSL_CERT_DIR", "NETRC",
    "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
)
TAIL_LINES = 25


@dataclass(frozen=True)
class UvTool:
    path: Path
    version: str


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env.update(extra)
    return env


def run(
    cmd: Sequence[str | Path],
    *,
    what: str,
    env: dict[str, str],
    log_dir: Path,
    cwd: Path | None = None,
    timeout: float | None = None,
    show: Callable[[str], None] | None = None,
) -> str:
    """Run `cmd`, return its combined output; raise CommandError with the tail of it on failure.
    The child runs under procs.run: in a process group of its own that is killed, grandchildren
    and all, on every way out of this call and when this process dies."""
    from llmgw_store.supervise import procs

    argv = [str(c) for c in cmd]
    if show is not None:
        show("$ " + " ".join(argv))
    try:
        done = procs.run(argv, env=env, cwd=cwd, timeout=timeout, label=what)
    except FileNotFoundError:
        raise CommandError(f"{what}: {argv[0]} not found") from None
    if done.timed_out:
        log = _write_log(log_dir, what, argv, done.output)
        raise CommandError(f"{what} timed out after {timeout:.0f}s", output_tail=_tail(done.output), log=log)
    if done.returncode != 0:
        log = _write_log(log_dir, what, argv, done.output)
        raise CommandError(f"{what} failed (exit {done.returncode})", output_tail=_tail(done.output), log=log)
    return done.output


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])


def _write_log(log_dir: Path, what: str, argv: list[str], output: str) -> Path:
    log_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")[:40]
    log = log_dir / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{slug}.log"
    log.write_text("$ " + " ".join(argv) + "\n" + output)
    return log


def version_of(binary: Path, log_dir: Path) -> str:
    out = run([binary, "--version"], what=f"{binary} --version", env=clean_env(), log_dir=log_dir)
    m = re.match(r"uv (\S+)", out.strip())
    if not m:
        raise UsageError(f"{binary} does not look like uv: `--version` printed {out.strip()[:80]!r}")
    return m.group(1)


def resolve(store: Store, uv_path: str | Path | None, index_url: str, *, later: bool = False,
            auth: IndexAuth | None = None, install: bool = True) -> UvTool | PendingUv:
    """The uv to build with: `uv_path` if given (its version memoised by inode, size and mtime), else
    the store's own pinned uv, installed on first use (from the shipped binary, else the wheel on
    `index_url`, sent `auth`). With `install=False` (nothing will be built) a missing store path
    is not made: the shipped binary itself answers, as an `uv_path` would. With `later`, an
    `uv_path` whose version is not remembered gives a PendingUv: `uv --version` runs in a thread
    while the caller goes on."""
    if uv_path is None and not install and not _pinned_present(store):
        uv_path = checked_shipped(store)  # None: not shipped, so it must be installed after all
    if uv_path is not None:
        path = Path(uv_path).absolute()
        stamp = file_stamp(path)
        if stamp is None:
            raise UsageError(f"--uv {uv_path}: no such file")
        memo = store.index.tool_info("uv", str(path))
        if memo and memo.get("stamp") == stamp:
            return UvTool(path, memo["version"])
        pending = PendingUv(store, path, stamp)
        return pending if later else pending.tool()
    return _pinned(store, index_url, auth)


def shipped() -> Path | None:
    """The uv binary of the `uv` package installed beside llmgw-store (pyproject pins it), when
    that package is the pinned version; else None (then the wheel is downloaded)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        if version("uv") != UV_VERSION:
            return None
        found = Path(find_uv_bin())
    except (PackageNotFoundError, FileNotFoundError, OSError):
        return None
    return found if found.is_file() else None


def checked_shipped(store: Store | None = None) -> Path | None:
    """`shipped()`, once it is shown to be a file no other user could change (`open_shipped`) whose
    bytes are the ones pip's RECORD lists for it (IntegrityError otherwise): the one way to a
    shipped binary that may be run by its path, `--version` included. The check (a sha256 of the
    whole binary, read from the descriptor the trust rule opened) is memoised in `store`'s index by
    the file's device, inode, size, mtime and ctime: a binary written in place has a new ctime,
    whatever its mtime says. The trust rule is what makes running it by its path after the hash
    sound: only root or this user could swap its bytes in between."""
    found = shipped()
    if found is None:
        return None
    fd, st = open_shipped(found)
    try:
        stamp = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        if store is not None:
            memo = store.index.tool_info("uv-shipped", str(found))
            if memo and memo.get("stamp") == stamp:
                return found
        recorded = _recorded_sha256(found)
        if recorded is not None:
            import hashlib

            digest = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
            if digest.hexdigest() != recorded:
                raise _not_recorded(found)
    finally:
        os.close(fd)
    if store is not None:
        store.index.remember_tool("uv-shipped", str(found), {"stamp": stamp, "sha256": recorded})
    return found


def open_shipped(found: Path) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the shipped binary, if it is held to the config file's trust rule
    (system/files.open_trusted: it and every directory above it root's or this user's, writable by
    no one else, links only in such directories); UnsafePathError (exit 2) otherwise, before a byte
    of it is read or run: another user who may write it could swap its bytes between their check
    and their run as root. The caller closes the fd."""
    from llmgw_store.system.files import FileRefused, open_trusted

    try:
        return open_trusted(found)
    except FileRefused as exc:
        raise UnsafePathError(f"refusing to run the uv this llmgw-store ships, {found}: it {exc.reason}, so another "
                              "user could change it between its check and its run; install llmgw-store where only "
                              "root (or you) can write, or pass --uv PATH") from None


def _not_recorded(found: Path) -> IntegrityError:
    return IntegrityError(f"{found} is not the file the uv {UV_VERSION} package installed (its sha256 differs from "
                          "the package's RECORD); reinstall llmgw-store, or pass --uv PATH")


def _recorded_sha256(binary: Path) -> str | None:
    """The sha256 pip recorded (the dist's RECORD) for the shipped `binary`, hex; None if unlisted."""
    import base64
    from importlib.metadata import distribution

    try:
        for f in distribution("uv").files or ():
            if f.hash is not None and f.hash.mode == "sha256" and Path(f.locate()).resolve() == binary.resolve():
                return base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4)).hex()
    except (OSError, ValueError):
        return None
    return None

class PendingUv:
    """An --uv first seen by this store: its `--version` is asked in a thread (a child under
    procs.run, which may be started from any thread) while planning goes on (the interpreter is
    found meanwhile). `path` is known at once; `tool()` waits for the version and remembers it in
    the index from the caller's thread (the index's connection is that thread's alone)."""

    pending = True

    def __init__(self, store: Store, path: Path, stamp: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.path, self._store, self._stamp = path, store, stamp
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            self._version = pool.submit(version_of, path, store.layout.logs)
        finally:
            pool.shutdown(wait=False)

    @property
    def version(self) -> str:
        return self.tool().version

    def tool(self) -> UvTool:
        version = self._version.result()  # raises what version_of raised (not uv, cannot run)
        self._store.index.remember_tool("uv", str(self.path), {"stamp": self._stamp, "version": version})
        return UvTool(self.path, version)


def _pinned_key() -> tuple[dict, str, str]:
    inputs = {"schema": SCHEMA_VERSION, "tool": "uv", "version": UV_VERSION, "platform": platform_facts()}
    key = store_key(inputs)
    return inputs, key, path_name(key, "uv", UV_VERSION, "bin")


def _pinned_present(store: Store) -> bool:
    _, key, name = _pinned_key()
    return store.index.path_by_key(key) is not None and store.layout.path_of(name).is_dir()


def _pinned(store: Store, index_url: str, auth: IndexAuth | None = None) -> UvTool:
    from llmgw_store.build.realise import realise

    inputs, key, name = _pinned_key()

    def make(partial: Path) -> dict:
        found = shipped()
        if found is not None:
            return _copy_shipped(store, partial, found)
        network.require(f"installing uv {UV_VERSION} (not shipped with this llmgw-store) from {index_url}",
                        "install llmgw-store with its pinned uv dependency, or pass --uv PATH")
        return _install_wheel(store, partial, index_url, auth)

    meta = {"engine": "uv", "version": UV_VERSION, "variant": "bin", "binary": "uv"}
    path, _ = realise(store, key, name, inputs, meta, make)
    return UvTool(path / "bin" / "uv", UV_VERSION)


def _copy_shipped(store: Store, partial: Path, found: Path) -> dict:
    """Copy the shipped binary into the store path being made (only one no other user could change:
    `open_shipped`), hashing what is copied: the copy must have the digest pip recorded for the file
    (a binary changed in place is refused) and say it is UV_VERSION. Builds run the copy, never the file in the Python environment."""
    import hashlib

    src = os.fdopen(open_shipped(found)[0], "rb")
    say(f"installing uv {UV_VERSION} from {found} (the uv this llmgw-store ships)")
    (partial / "bin").mkdir(parents=True)
    target = partial / "bin" / "uv"
    digest = hashlib.sha256()
    with src, open(target, "xb") as out:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    recorded = _recorded_sha256(found)
    if recorded is not None and recorded != digest.hexdigest():
        raise _not_recorded(found)
    target.chmod(0o755)
    got = version_of(target, store.layout.logs)
    if got != UV_VERSION:
        raise IntegrityError(f"{found} is uv {got}, not the pinned {UV_VERSION}")
    return {"source": "shipped", "sha256": digest.hexdigest()}


def _install_wheel(store: Store, partial: Path, index_url: str, auth: IndexAuth | None = None) -> dict:
    import zipfile

    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    from llmgw_store.build import pypi
    from llmgw_store.system.trees import sha256_of

    say(f"installing uv {UV_VERSION} from its wheel on {index_url}")
    try:
        listed = pypi.project_files(index_url, "uv", auth)
    except UsageError:
        listed = []
    files = [f for f in listed if f.filename.endswith(".whl") and f.version == UV_VERSION]
    rank = {tag: i for i, tag in enumerate(sys_tags())}
    best = None
    for f in files:
        tags = parse_wheel_filename(f.filename)[3]
        score = min((rank[t] for t in tags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, f)
    if best is None:
        raise UsageError(f"{index_url} has no uv {UV_VERSION} wheel for this platform; pass --uv PATH")
    wheel = best[1]
    if not wheel.sha256:
        raise IntegrityError(f"{index_url} publishes no sha256 for {wheel.filename}; refusing an unverifiable uv")
    dest = store.layout.downloads / wheel.filename
    if not dest.exists() or sha256_of(dest) != wheel.sha256:
        pypi.download(wheel.url, dest, wheel.sha256, auth, index_url)
    member = f"uv-{UV_VERSION}.data/scripts/uv"
    (partial / "bin").mkdir(parents=True)
    target = partial / "bin" / "uv"
    try:
        with zipfile.ZipFile(dest) as zf, zf.open(member) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    except KeyError:
        raise IntegrityError(f"{wheel.filename} has no {member}; it is not a uv wheel") from None
    target.chmod(0o755)
    found = version_of(target, store.layout.logs)
    if found != UV_VERSION:
        raise IntegrityError(f"{wheel.filename} holds uv {found}, not {UV_VERSION}")
    return {"wheel": wheel.filename, "wheel_sha256": wheel.sha256}
