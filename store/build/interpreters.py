"""Which Python interpreter a build uses, found once and memoised.

The interpreter found (its path, implementation and version) enters the key, so the same recipe on
a machine with another Python gets another store path. Discovery asks uv (`uv python find`, never
downloading, system and managed installations only — a stray .venv above the cwd must not count).
With the default preference, `managed`, an interpreter uv manages for the store (ROOT/python) comes
first, then one the host has, and only when neither exists is one downloaded (`uv python install`
into ROOT/python): a host with a suitable Python spends no time on a download. `only-managed`
always wants a managed one and falls back to the host's when the download cannot be reached
("system where managed downloads cannot be reached"); `only-system` never downloads.

A download is attempted only after a connect probe (PROBE_TIMEOUT_S) to its host — or to the
proxy the environment names — succeeds, so an unreachable host costs at most that long, not uv's
retries with back-off (9 s here).

A pyenv shim on PATH (`~/.pyenv/shims/python3.12`) exits 127 when the version it stands for is
installed in pyenv but not selected; uv stops at the first such executable. Such a shim is taken
for what it is — no interpreter — and the search goes on without its directory; if nothing is
found, the error says that pyenv has the version and how to expose it.

A store that other users read (its root is reachable by them: root's /var/lib/llmgw-store, the
default) is for services that run as other users (a unit's `User=`). There an interpreter they
cannot execute — one in a private home, such as root's pyenv — would make every environment built
on it useless to them, so one every user can run is preferred: what uv finds in the PATH directories
they can enter (searched first, so a private directory's shims are not even started), else another
installation uv finds (a
system one, one managed under the store's root), else, where the preference allows downloads, a
managed one. An explicit path (`build.python = "/..."`, `--python PATH`) is taken as given, and
`build` warns when what it made is still not runnable by other users (`warn_if_private`).

The memo is keyed by (request, preference, uv version, shared or not) and holds the interpreter's
file stamp, so a cache-hit build neither runs uv nor starts the interpreter.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw_store.base import defaults
from llmgw_store.base.errors import CommandError, UsageError
from llmgw_store.base.report import heartbeat, say
from llmgw_store.build.uv import PendingUv, UvTool, clean_env, run
from llmgw_store.core.index import file_stamp

if TYPE_CHECKING:
    from llmgw_store.core.local_store import Store

PREFERENCES = defaults.PYTHON_PREFERENCES
DEFAULT_PREFERENCE = defaults.PYTHON_PREFERENCE
_PROBE = "import json, platform, sys; print(json.dumps([sys.executable, platform.python_implementation(), platform.python_version()]))"


@dataclass(frozen=True)
class Interpreter:
    path: str
    implementation: str
    version: str
    managed: bool

    def key_facts(self, request: str) -> dict[str, str]:
        return {"request": request, "implementation": self.implementation, "version": self.version}


def find(store: Store, uv: UvTool | PendingUv, request: str, preference: str, *, downloads: bool = True) -> Interpreter:
    """The interpreter for `request` under `preference`; `downloads` False (a --substitute-only
    node, which reaches nothing but its caches): only what is installed, never a download, nor the
    probe of the download host."""
    if preference not in PREFERENCES:
        raise UsageError(f"python preference {preference!r} is not one of {', '.join(PREFERENCES)}")
    # A uv whose version is still being asked (uv.PendingUv: one this store has not seen, so no
    # memo names its version) is not waited for: discovery needs only its path.
    shared = "|shared" if others_reach(store.layout.root) else ""
    if not getattr(uv, "pending", False):
        memo = store.index.tool_info("python", f"{request}|{preference}|{uv.version}{shared}")
        if memo and memo["stamp"] == file_stamp(Path(memo["path"])):
            return Interpreter(memo["path"], memo["implementation"], memo["version"], memo["managed"])
    found = _discover(store, uv, request, preference, downloads)
    ident = f"{request}|{preference}|{uv.version}{shared}"
    store.index.remember_tool("python", ident, {**asdict(found), "stamp": file_stamp(Path(found.path))})
    return found


PROBE_TIMEOUT_S = 2.0
DOWNLOAD_HOST = ("github.com", 443)  # where uv 0.13 downloads managed interpreters from
_SHIM_FAILED = re.compile(r"Failed to inspect Python interpreter from [^`\n]{0,80} at `([^`\n]{1,4096})`")
_PYENV_HAS = re.compile(r"exists in these Python versions:\s*\n((?:[ \t]+[0-9A-Za-z._/-]{1,64}\n?){1,32})")
MAX_SHIMS = 4


def _discover(store: Store, uv: UvTool | PendingUv, request: str, preference: str, downloads: bool = True) -> Interpreter:
    with heartbeat(f"looking for a Python {request} (--python-preference {preference})"):
        return _discover_quietly(store, uv, request, preference, downloads)


def _discover_quietly(store: Store, uv: UvTool | PendingUv, request: str, preference: str, downloads: bool = True) -> Interpreter:
    if not request.startswith("/") and others_reach(store.layout.root):
        found = _found_where_others_reach(store, uv, request, preference)
        if found is not None:
            return found
    path, skipped = _uv_find(store, uv, request, preference)
    if path is None and preference in ("only-managed", "managed"):
        path = _install_managed(store, uv, request, preference, downloads)
        if path is None and preference == "only-managed":
            say(f"using a system interpreter: no managed Python {request} could be downloaded")
            path, skipped = _uv_find(store, uv, request, "only-system")
    if path is None:
        raise UsageError(_missing(request, preference, skipped))
    found = _probe(store, path, request, preference)
    if not request.startswith("/") and others_reach(store.layout.root):
        why = why_others_cannot_run(found.path)
        if why is not None:
            other = _runnable_by_all(store, uv, request, preference, downloads)
            if other is not None:
                say(f"using {other.path} rather than {found.path}, which other users cannot run ({why}): "
                    "this store is read by other users")
                return other
    return found


def _found_where_others_reach(store: Store, uv: UvTool | PendingUv, request: str, preference: str) -> Interpreter | None:
    """For a store other users read: what uv finds with only the PATH directories they can enter,
    if every user can run it, else None (the full search follows). An interpreter reached through
    a private directory is one they cannot run, so that directory is not searched first: uv does
    not start what it holds (root's pyenv shims, each a chain of some 30 bash processes, in `find`
    and three times more in `list`: 0.9 s of a 2.8 s black build measured here). Each public
    directory keeps its place in PATH, so the answer is the one the full search would give when
    that one is runnable by all."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    public = [d for d in dirs if d.startswith("/") and _why_closed(os.path.normpath(d), want_file=False) is None]
    if len(public) == len(dirs):
        return None  # the full search is the same search
    path, skipped = _uv_find(store, uv, request, preference, search_path=os.pathsep.join(public), tell=False)
    if path is None or why_others_cannot_run(path) is not None:
        return None  # the full search follows, and says which shims it passed over
    try:
        found = _probe(store, path, request, preference)
    except UsageError:
        return None
    if why_others_cannot_run(found.path) is not None:
        return None
    for said in skipped:
        say(f"passing over {said}")
    return found


def _probe(store: Store, path: str, request: str, preference: str) -> Interpreter:
    try:
        # -I -S: the answer does not depend on site-packages or PYTHON* variables, and the start is shorter.
        out = run([path, "-I", "-S", "-c", _PROBE], what=f"inspect {path}", env=clean_env(), log_dir=store.layout.logs)
        executable, implementation, version = json.loads(out.strip().splitlines()[-1])
    except (CommandError, ValueError) as exc:  # a shim that fails, a wrapper that prints something else
        raise UsageError(f"{path}, found for Python {request}, does not run as an interpreter ({exc}); "
                         + _how_to_install(request, preference)) from None
    managed = Path(executable).resolve().is_relative_to(store.layout.python_installs.resolve())
    return Interpreter(executable, implementation, version, managed)


MAX_CANDIDATES = 16


def _runnable_by_all(store: Store, uv: UvTool | PendingUv, request: str, preference: str,
                     downloads: bool = True) -> Interpreter | None:
    """An interpreter for `request` that every user can run: among the installations uv knows
    (`uv python list --only-installed`, in uv's order), else a managed one downloaded where the
    preference allows; None when there is none."""
    try:
        out = run([uv.path, "python", "list", "--only-installed", "--output-format", "json",
                   "--python-preference", preference, "--", request],
                  what=f"uv python list {request}", env=_env(store, downloads="never"), log_dir=store.layout.logs,
                  cwd=store.layout.tmp)
        listed = json.loads(out)
    except (CommandError, ValueError):
        listed = []
    seen: set[str] = set()
    for entry in listed[:MAX_CANDIDATES] if isinstance(listed, list) else []:
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path.startswith("/") or path in seen:
            continue
        seen.add(path)
        if why_others_cannot_run(path) is None:
            try:
                found = _probe(store, path, request, preference)
            except UsageError:
                continue
            if why_others_cannot_run(found.path) is None:
                return found
    if preference in ("managed", "only-managed"):
        path = _install_managed(store, uv, request, preference, downloads)
        if path is not None and why_others_cannot_run(path) is None:
            return _probe(store, path, request, preference)
    return None


# --- who can run what -------------------------------------------------------------------------------

def others_reach(root: Path) -> bool:
    """Whether users other than the store's owner can reach `root` (every directory from / down
    to it lets others through): then the store is read by services running as other users."""
    return _why_closed(os.path.abspath(root), want_file=False) is None


def why_others_cannot_run(path: str | Path) -> str | None:
    """None when every user can execute `path` — each directory on the way to it, through every
    link, lets others through, and the file it ends at is executable by others —, else why not
    (`/root is mode 700`)."""
    return _why_closed(os.path.abspath(path), want_file=True)


def _why_closed(path: str, *, want_file: bool) -> str | None:
    import stat

    for _ in range(40):  # links followed, as the kernel's limit
        parts = path.split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i]) or "/"
            try:
                mode = os.stat(d).st_mode
            except OSError as exc:
                return f"{d}: {exc.strerror}"
            if not mode & stat.S_IXOTH:
                return f"{d} is mode {stat.S_IMODE(mode):o}: other users may not enter it"
        try:
            st = os.lstat(path)
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        if stat.S_ISLNK(st.st_mode):
            path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
            continue
        if want_file and not (stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IXOTH):
            return f"{path} is mode {stat.S_IMODE(st.st_mode):o}: other users may not execute it"
        if not want_file and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IXOTH):
            return f"{path} is mode {stat.S_IMODE(st.st_mode):o}: other users may not enter it"
        return None
    return f"{path}: too many levels of links"


def warn_if_private(layout, env: Path) -> str | None:
    """In a store other users read, say (one line) when the environment `env` is not runnable by
    them, and why; returns the reason (None: nothing to say)."""
    if not others_reach(layout.root):
        return None
    why = why_others_cannot_run(env / "bin" / "python")
    if why is not None:
        say(f"warning: other users cannot run {env.name}: its interpreter is not theirs to run ({why}); "
            "build it with one every user can run (--python /usr/bin/python3.X, or a managed one with "
            "--python-preference managed)")
    return why


def _install_managed(store: Store, uv: UvTool | PendingUv, request: str, preference: str, downloads: bool = True) -> str | None:
    """Download a managed interpreter into ROOT/python and find it; None (having said why) when the
    download host cannot be reached or the download fails (a usage error for `managed`: there is
    nothing else to fall back to after the host's own were looked at)."""
    from llmgw_store.app import network

    if network.is_offline():
        say(f"no managed Python {request} download: --offline")
        return None
    if not downloads:
        say(f"no managed Python {request} download: --substitute-only (a node reaches nothing but its caches; "
            f"install it into {store.layout.python_installs} if the builder's key names one)")
        return None
    host = _download_host()
    if not _reachable(host):
        say(f"no managed Python {request} download: {host[0]}:{host[1]} cannot be reached "
            f"(connect probe, {PROBE_TIMEOUT_S:.0f}s)")
        return None
    say(f"installing a managed Python {request} into {store.layout.python_installs}")
    try:
        run([uv.path, "python", "install", "--", request], what=f"uv python install {request}",
            env=_env(store, downloads="automatic"), log_dir=store.layout.logs, cwd=store.layout.tmp)
    except CommandError as exc:
        say(f"a managed Python {request} cannot be downloaded: {exc}")
        return None
    return _uv_find(store, uv, request, preference)[0]


def _uv_find(store: Store, uv: UvTool | PendingUv, request: str, preference: str,
             search_path: str | None = None, tell: bool = True) -> tuple[str | None, list[str]]:
    """(the interpreter uv finds, the failing shims passed over with what they said); `search_path`
    in place of PATH; `tell` False: the shims passed over are not said."""
    env = _env(store, downloads="never")
    if search_path is not None:
        env = {**env, "PATH": search_path}
    skipped: list[str] = []
    for _ in range(MAX_SHIMS + 1):
        try:
            out = run([uv.path, "python", "find", "--system", "--python-preference", preference, "--", request],
                      what=f"uv python find {request}", env=env, log_dir=store.layout.logs, cwd=store.layout.tmp)
        except CommandError as exc:
            shim = _failed_shim(exc.output_tail)
            if shim is None or len(skipped) >= MAX_SHIMS:
                return None, skipped
            skipped.append(shim[1])
            shims = os.path.realpath(store.layout.tmp / shim[0]).rsplit("/", 1)[0]  # uv may name it relative to cwd
            path = [d for d in env.get("PATH", "").split(os.pathsep) if d and os.path.realpath(d) != shims]
            env = {**env, "PATH": os.pathsep.join(path)}
            if tell:
                say(f"passing over {shim[1]}")
            continue
        lines = out.strip().splitlines()
        return (lines[-1].strip() if lines else None), skipped
    return None, skipped


def _failed_shim(output: str) -> tuple[str, str] | None:
    """(path as uv names it, what it said) when uv stopped at a pyenv shim that failed, else None."""
    m = _SHIM_FAILED.search(output)
    if m is None:
        return None
    path = m.group(1)
    if Path(path).parent.name != "shims":
        return None
    has = _PYENV_HAS.search(output)
    versions = has.group(1).split() if has else []
    said = (f"{path} is a pyenv shim for {', '.join(versions)}, which pyenv does not select" if versions
            else f"{path} is a pyenv shim that runs nothing")
    return path, said


def _missing(request: str, preference: str, skipped: list[str]) -> str:
    pyenv = "".join(f"; {s} (`pyenv global` can add it)" for s in skipped)
    return f"no Python {request} found (--python-preference {preference}{pyenv}); " + _how_to_install(request, preference)


def _how_to_install(request: str, preference: str) -> str:
    text = (f"install one (`uv python install {request}`, or your distribution's python{request} package), "
            f"or pass one's absolute path (--python PATH, or build.python in the recipe)")
    if preference == "only-system":
        text += ", or let the store download one with --python-preference managed"
    return text


def _download_host() -> tuple[str, int]:
    """Where a download connects first: the proxy uv would use (https_proxy, ALL_PROXY), else the host."""
    from urllib.parse import urlsplit

    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        if os.environ.get(name):
            try:
                u = urlsplit(os.environ[name] if "://" in os.environ[name] else "http://" + os.environ[name])
                if u.hostname:
                    return u.hostname, u.port or (443 if u.scheme == "https" else 1080 if "socks" in u.scheme else 80)
            except ValueError:
                break
    return DOWNLOAD_HOST


def _reachable(host: tuple[str, int], timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to `host` opens within `timeout` s, name lookup included (which
    has no timeout of its own: it runs in a daemon thread that is given up on)."""
    import socket
    import threading

    result: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection(host, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    t = threading.Thread(target=attempt, name="download probe", daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])


def _env(store: Store, downloads: str) -> dict[str, str]:
    return clean_env(
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(store.layout.uv_cache),
        UV_PYTHON_INSTALL_DIR=str(store.layout.python_installs),
        UV_PYTHON_DOWNLOADS=downloads,
    )
