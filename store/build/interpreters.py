"""Which Python interpreter a build uses, found once and memoised.

The interpreter found (its path, implementation and version) enters the key, so the same recipe on
a machine with another Python gets another store path. Discovery asks uv (`uv python find`, never
downloading, system and managed installations only — a stray .venv above the cwd must not count);
with a managed preference and nothing found, `uv python install` puts one under ROOT/python. Where
managed downloads cannot be reached and the preference is the default `only-managed`, the build
falls back to a system interpreter and says so (DESIGN.md: "system where managed downloads cannot be
reached"); `--python-preference only-system` skips the download attempt.

The memo is keyed by (request, preference, uv version) and holds the interpreter's file stamp, so a
cache-hit build neither runs uv nor starts the interpreter.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw_store.build.uv import UvTool, clean_env, run
from llmgw_store.core import defaults
from llmgw_store.core.errors import CommandError, UsageError
from llmgw_store.core.index import file_stamp
from llmgw_store.core.report import say

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
    ident = f"{request}|{preference}|{uv.version}"
    memo = store.index.tool_info("python", ident)
    if memo and memo["stamp"] == file_stamp(Path(memo["path"])):
        return Interpreter(memo["path"], memo["implementation"], memo["version"], memo["managed"])
    found = _discover(store, uv, request, preference)
    store.index.remember_tool("python", ident, {**asdict(found), "stamp": file_stamp(Path(found.path))})
    return found


def _discover(store: "Store", uv: UvTool, request: str, preference: str) -> Interpreter:
    path = _uv_find(store, uv, request, preference)
    if path is None and preference in ("only-managed", "managed"):
        say(f"installing a managed Python {request} into {store.layout.python_installs}")
        try:
            run([uv.path, "python", "install", "--", request], what=f"uv python install {request}",
                env=_env(store, downloads="automatic"), log_dir=store.layout.logs, cwd=store.layout.tmp)
            path = _uv_find(store, uv, request, preference)
        except CommandError as exc:
            if preference != "only-managed":
                raise
            say(f"a managed Python {request} cannot be downloaded (see {exc.log}); using a system interpreter")
            path = _uv_find(store, uv, request, "only-system")
    if path is None:
        raise UsageError(
            f"no Python {request} found with preference {preference}; install one, or choose another "
            f"--python-preference ({', '.join(PREFERENCES)})"
        )
    out = run([path, "-c", _PROBE], what=f"inspect {path}", env=clean_env(), log_dir=store.layout.logs)
    executable, implementation, version = json.loads(out.strip().splitlines()[-1])
    managed = Path(executable).resolve().is_relative_to(store.layout.python_installs.resolve())
    return Interpreter(executable, implementation, version, managed)


def _uv_find(store: "Store", uv: UvTool, request: str, preference: str) -> str | None:
    try:
        out = run([uv.path, "python", "find", "--system", "--python-preference", preference, "--", request],
                  what=f"uv python find {request}", env=_env(store, downloads="never"),
                  log_dir=store.layout.logs, cwd=store.layout.tmp)
    except CommandError:
        return None
    lines = out.strip().splitlines()
    return lines[-1].strip() if lines else None


def _env(store: "Store", downloads: str) -> dict[str, str]:
    return clean_env(
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(store.layout.uv_cache),
        UV_PYTHON_INSTALL_DIR=str(store.layout.python_installs),
        UV_PYTHON_DOWNLOADS=downloads,
    )
