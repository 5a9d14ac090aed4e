"""Running things from a profile: shell lines for its environment, or exec a command in it.

Both work for any user who can read the store, not only its owner (an engine runs as a service
user): they open the store as a reader (core/diskview.py), write nothing and take no temp root.
A running engine is kept from gc by its profile and by gc's scan of /proc (roots/liveroots.py)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result
from llmgw_store.base.errors import NotFoundError, UsageError
from llmgw_store.core.diskview import open_reader
from llmgw_store.roots.generations import current_generation
from llmgw_store.roots.resolve import is_profile, reference


@dataclass(frozen=True)
class EnvLines(Result):
    variables: dict[str, str]

    def body(self) -> dict[str, Any]:
        return {"variables": dict(self.variables)}


def env_lines(target: str, *, root: str | Path | None = None) -> EnvLines:
    """Variables for a shell. For a PROFILE: the profile's link, so a new shell follows later
    switches; for PROFILE@N, a store path, its name or key: that store path."""
    with open_reader(root) as store:
        if is_profile(store, target):
            current_generation(store.layout, target)  # a profile link that points at a generation
            env_dir = store.layout.profiles / target
        else:
            env_dir = store.layout.path_of(reference(store, target).name)
        return EnvLines({"VIRTUAL_ENV": str(env_dir),
                         "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"})


def shell_text(variables: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in variables.items())


def exec_in(target: str, argv: list[str], *, root: str | Path | None = None) -> None:
    """Replace this process with `argv` run in `target`: a profile's current generation, PROFILE@N,
    or a store path (its name, its key). The store path is resolved once, now: a running engine
    keeps its environment across later switches (and gc sees it through /proc as long as it runs)."""
    if not argv:
        raise UsageError("no command given: llmgw-store run PROFILE -- COMMAND [ARGS...]")
    with open_reader(root) as store:
        env_dir = store.layout.path_of(reference(store, target).name)
        where = f"profile {target}" if is_profile(store, target) else target
    env = dict(os.environ, VIRTUAL_ENV=str(env_dir))
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        raise NotFoundError(f"{argv[0]}: command not found in {where} ({env_dir}/bin) or on PATH") from None
