"""Which Python interpreter a build uses, found once and memoised.

The interpreter found (its path, implementation and version) enters the key, so the same recipe on
a machine with another Python gets another store path. Discovery asks uv (`uv python find`, never
downloading, system and managed installations only — a stray .venv above the cwd must not count).
With the default preference, `managed`, an interpreter uv manages for the store (ROOT/python) comes
first, then one the host has, and only when neither exists is one downloaded (`uv python install`
into ROOT/python): a host with a suitable Python spends no time on a download. `only-managed`
always wants a managed one and falls back to the host's when the download cannot be reached
(DESIGN.md: "system where managed downloads cannot be reached"); `only-system` never downloads.

A download is attempted only after a connect probe (PROBE_TIMEOUT_S) to its host — or to the
proxy the environment names — succeeds, so an unreachable host costs at most that long, not uv's
retries with back-off (9 s here).

A pyenv shim on PATH (`~/.pyenv/shims/python3.12`) exits 127 when the version it stands for is
installed in pyenv but not selected; uv stops at the first such executable. Such a shim is taken
for what it is — no interpreter — and the search goes on without its directory; if nothing is
found, the error says that pyenv has the version and how to expose it.

The memo is keyed by (request, preference, uv version) and holds the interpreter's file stamp, so a
cache-hit build neither runs uv nor starts the interpreter.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw_store.build.uv import UvTool, clean_env, run
from llmgw_store.core import defaults
from llmgw_store.core.errors import CommandError, UsageError
from llmgw_store.core.index import file_stamp
from llmgw_store.core.report import heartbeat, say

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


def find(store: "Store", uv: UvTool, request: str, preference: str) -> Interpreter:
    if preference not in PREFERENCES:
        raise UsageError(f"python preference {preference!r} is not one of {', '.join(PREFERENCES)}")
    # A uv whose version is still being asked (uv.PendingUv: one this store has not seen, so no
    # memo names its version) is not waited for: discovery needs only its path.
    if not getattr(uv, "pending", False):
        memo = store.index.tool_info("python", f"{request}|{preference}|{uv.version}")
        if memo and memo["stamp"] == file_stamp(Path(memo["path"])):
            return Interpreter(memo["path"], memo["implementation"], memo["version"], memo["managed"])
    found = _discover(store, uv, request, preference)
    ident = f"{request}|{preference}|{uv.version}"
    store.index.remember_tool("python", ident, {**asdict(found), "stamp": file_stamp(Path(found.path))})
    return found


PROBE_TIMEOUT_S = 2.0
DOWNLOAD_HOST = ("github.com", 443)  # where uv 0.13 downloads managed interpreters from
_SHIM_FAILED = re.compile(r"Failed to inspect Python interpreter from [^`\n]{0,80} at `([^`\n]{1,4096})`")
_PYENV_HAS = re.compile(r"exists in these Python versions:\s*\n((?:[ \t]+[0-9A-Za-z._/-]{1,64}\n?){1,32})")
MAX_SHIMS = 4


def _discover(store: "Store", uv: UvTool, request: str, preference: str) -> Interpreter:
    with heartbeat(f"looking for a Python {request} (--python-preference {preference})"):
        return _discover_quietly(store, uv, request, preference)


def _discover_quietly(store: "Store", uv: UvTool, request: str, preference: str) -> Interpreter:
    path, skipped = _uv_find(store, uv, request, preference)
    if path is None and preference in ("only-managed", "managed"):
        path = _install_managed(store, uv, request, preference)
        if path is None and preference == "only-managed":
            say(f"using a system interpreter: no managed Python {request} could be downloaded")
            path, skipped = _uv_find(store, uv, request, "only-system")
    if path is None:
        raise UsageError(_missing(request, preference, skipped))
    try:
        # -I -S: the answer does not depend on site-packages or PYTHON* variables, and the start is shorter.
        out = run([path, "-I", "-S", "-c", _PROBE], what=f"inspect {path}", env=clean_env(), log_dir=store.layout.logs)
        executable, implementation, version = json.loads(out.strip().splitlines()[-1])
    except (CommandError, ValueError) as exc:  # a shim that fails, a wrapper that prints something else
        raise UsageError(f"{path}, found for Python {request}, does not run as an interpreter ({exc}); "
                         + _how_to_install(request, preference)) from None
    managed = Path(executable).resolve().is_relative_to(store.layout.python_installs.resolve())
    return Interpreter(executable, implementation, version, managed)


def _install_managed(store: "Store", uv: UvTool, request: str, preference: str) -> str | None:
    """Download a managed interpreter into ROOT/python and find it; None (having said why) when the
    download host cannot be reached or the download fails (a usage error for `managed`: there is
    nothing else to fall back to after the host's own were looked at)."""
    from llmgw_store.core import network

    if network.is_offline():
        say(f"no managed Python {request} download: --offline")
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


def _uv_find(store: "Store", uv: UvTool, request: str, preference: str) -> tuple[str | None, list[str]]:
    """(the interpreter uv finds, the failing shims passed over with what they said)."""
    env = _env(store, downloads="never")
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
            f"or set build.python to an interpreter's absolute path")
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


def _env(store: "Store", downloads: str) -> dict[str, str]:
    return clean_env(
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(store.layout.uv_cache),
        UV_PYTHON_INSTALL_DIR=str(store.layout.python_installs),
        UV_PYTHON_DOWNLOADS=downloads,
    )
