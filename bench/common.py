"""What the benches share besides measuring (bench/harness.py measures): the store's command, the
loopback package index of the quick modes, registered copies of a store path."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness import CLI, PY, REPO, Meter, Run

sys.path.insert(0, str(REPO))  # tests.support: the loopback index and the wheel builder

__all__ = ["CLI", "PY", "REPO", "cli", "clone_registered", "packages", "quick_index", "store_json", "tiny_recipe",
           "uv_bin"]


def uv_bin() -> str:
    """The uv the store is pinned to (the install's `uv` dependency): both sides of a build use it."""
    from uv import find_uv_bin

    return find_uv_bin()


def cli(root: Path, *args: str) -> list[str]:
    """argv of the installed `llmgw-store` on `root`."""
    return [str(CLI), "--root", str(root), *map(str, args)]


def store_json(meter: Meter, root: Path, *args: str, env: dict | None = None) -> tuple[dict, Run]:
    """Run `llmgw-store --json ARGS` on `root`, measured; its document (read by key: other fields
    come and go as the store changes) and the run."""
    print(f"running llmgw-store {' '.join(map(str, args))[:200]} (root {root})", file=sys.stderr, flush=True)
    run = meter.run(cli(root, "--json", *args), env=env)
    try:
        return json.loads(run.stdout), run
    except ValueError as exc:
        raise SystemExit(f"bench: llmgw-store {' '.join(args)} printed no JSON document: {exc}: {run.stdout[:500]}") from exc


# The quick modes' packages (the tests' index, tests/conftest.py): tinyengine 1.0 and 1.1 over
# tinydep 1.0 / 2.0, with dated releases, served on 127.0.0.1. Nothing reaches PyPI.
QUICK_RELEASES = [("tinydep", "1.0", "2024-01-01"), ("tinydep", "2.0", "2024-06-01"),
                  ("tinyengine", "1.0", "2024-02-01"), ("tinyengine", "1.1", "2024-07-01")]

def quick_index(wheels_dir: Path, extra: list[tuple[str, Path, str]] = ()):
    """A started loopback index (tests/support/index_server.py) with the quick releases and
    `extra` (project, wheel, ISO date); the caller stops it."""
    from tests.support.index_server import PackageIndex
    from tests.support.wheels import build_wheel

    idx = PackageIndex()
    for name, version, date in QUICK_RELEASES:
        reqs = ("tinydep",) if name == "tinyengine" else ()
        scripts = {"tinyengine": "tinyengine:main"} if name == "tinyengine" else None
        idx.add(name, build_wheel(wheels_dir, name, version, requires=reqs, scripts=scripts), date + "T00:00:00Z")
    for project, wheel, date in extra:
        idx.add(project, wheel, date)
    return idx.start()


def tiny_recipe(dest: Path, extra: str = 'version = "1.0"') -> Path:
    from tests.support.recipes import TINY_RECIPE

    dest.write_text(TINY_RECIPE.format(python=f"{sys.version_info.major}.{sys.version_info.minor}", extra=extra))
    return dest


@dataclass
class Packages:
    """Where a bench's recipe resolves: `recipe` with `index_args` for build; `tiny` (the tiny
    recipe) and `index` when the loopback index runs."""

    recipe: Path
    index_args: list[str]
    index: object | None
    tiny: Path | None


@contextmanager
def packages(work: Path, quick: bool, recipe: Path | None = None, default: Path | None = None, *,
             tiny_extra: str = 'version = "1.0"', index: bool = False):
    """The given recipe (else `default`, from PyPI), or — in --quick without one, or with no
    default — the tiny recipe on the loopback index. `index=True` starts the index anyway (rows
    that stay offline); it is stopped on exit."""
    idx = None
    try:
        use_tiny = recipe is None and (quick or default is None)
        if index or use_tiny:
            idx = quick_index(work / "wheels")
        tiny = tiny_recipe(work / "tiny.toml", extra=tiny_extra) if idx else None
        if use_tiny:
            yield Packages(tiny, ["--index-url", idx.url], idx, tiny)
        else:
            yield Packages(recipe or default, [], idx, tiny)
    finally:
        if idx is not None:
            idx.stop()


def clone_registered(root: Path, src_name: str, n: int, tag: str = "") -> list[str]:
    """n copies (cp -a: no shared inodes) of store path `src_name`, registered under fresh keys as
    paths nothing holds (`tag` makes another set)."""
    from llmgw_store.core.keys import store_key
    from llmgw_store.core.local_store import Store

    names = []
    with Store.open(root) as store:
        row = store.index.path_by_name(src_name)
        for i in range(n):
            key = store_key({"bench": i, "src": src_name, **({"tag": tag} if tag else {})})
            name = f"{key}-{src_name.split('-', 1)[1]}"
            subprocess.run(["cp", "-a", str(root / "store" / src_name), str(root / "store" / name)], check=True)
            b = store.index.start_build(key, name)
            store.index.register(dataclasses.replace(row, name=name, key=key), b, 0.0)
            names.append(name)
    return names
