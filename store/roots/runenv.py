"""Running things from a profile: shell lines for its environment, or exec a command in it."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core.errors import NotFoundError
from llmgw_store.core.local_store import Store
from llmgw_store.core.names import check_profile
from llmgw_store.core.results import Result
from llmgw_store.roots.generations import current_generation, generation_target


@dataclass(frozen=True)
class EnvLines(Result):
    variables: dict[str, str]

    def to_json(self) -> dict[str, str]:
        return dict(self.variables)


def env_lines(profile: str, *, root: str | Path | None = None) -> EnvLines:
    """Variables for a shell: the profile's link, so a new shell follows later switches."""
    check_profile(profile)
    with Store.open(root, readonly=True) as store:
        current_generation(store.layout, profile)  # exists?
        link = store.layout.profiles / profile
        return EnvLines({"VIRTUAL_ENV": str(link), "PATH": f"{link / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"})


def shell_text(variables: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in variables.items())


def exec_in(profile: str, argv: list[str], *, root: str | Path | None = None) -> None:
    """Replace this process with `argv` run in the profile's current generation. The store path is
    resolved once, now: a running engine keeps its environment across later switches (and gc sees
    it through /proc as long as it runs)."""
    check_profile(profile)
    if not argv:
        raise NotFoundError("no command given: llmgw-store run PROFILE -- COMMAND [ARGS...]")
    with Store.open(root) as store:
        number = current_generation(store.layout, profile)
        env_dir = store.layout.path_of(generation_target(store.layout, profile, number))
    env = dict(os.environ, VIRTUAL_ENV=str(env_dir))
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        raise NotFoundError(f"{argv[0]}: command not found in profile {profile} ({env_dir}/bin) or on PATH") from None
