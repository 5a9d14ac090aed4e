"""What the benches share besides measuring (bench/harness.py measures): the store's command, the
loopback package index of the quick modes, registered copies of a store path."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from harness import CLI, PY, REPO, Meter, Run

sys.path.insert(0, str(REPO))  # tests.support: the loopback index and the wheel builder

__all__ = ["CLI", "PY", "REPO", "black_standin", "cli", "clone_registered", "packages", "quick_index", "standin_recipe",
           "store_json", "tiny_recipe", "uv_bin"]


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

def black_standin(wheels_dir: Path) -> tuple[str, Path, str]:
    """A wheel shaped like black's environment (black, blib2to3, click, packaging, pathspec...):
    180 modules of 300 B to 12 kB and 24 compiled extensions of 20 to 120 kB (incompressible),
    as (project, wheel, date) for quick_index's `extra`. Deterministic: the same bytes every run."""
    import random

    from tests.support.wheels import build_wheel

    rng = random.Random(33)
    files: dict[str, bytes] = {}
    for i in range(180):
        pkg = ("black", "blib2to3/pgen2", "click", "packaging", "pathspec", "platformdirs")[i % 6]
        line = f"def f{i}(x):\n    return x + {i}  # {'-' * 40}\n".encode()
        files[f"blackstandin/{pkg}/m{i}.py"] = line * max(1, rng.randrange(300, 12_000) // len(line))
    for i in range(24):
        files[f"blackstandin/black/ext{i}.cpython-311-x86_64-linux-gnu.so"] = rng.randbytes(rng.randrange(20_000, 120_000))
    for d in ("black", "blib2to3", "blib2to3/pgen2", "click", "packaging", "pathspec", "platformdirs"):
        files[f"blackstandin/{d}/__init__.py"] = b""
    return "blackstandin", build_wheel(wheels_dir, "blackstandin", "24.1", extra_files=files), "2024-01-15T00:00:00Z"


def standin_recipe(dest: Path) -> Path:
    """The tiny engine with the black stand-in beside it (quick_index with black_standin)."""
    from tests.support.recipes import tiny_recipe as recipe_text

    dest.write_text(recipe_text('version = "1.0"', requirements=("tinyengine=={version}", "blackstandin==24.1")))
    return dest


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
    standin: Path | None = None  # the black stand-in's recipe (packages(standin=True))


@contextmanager
def packages(work: Path, quick: bool, recipe: Path | None = None, default: Path | None = None, *,
             tiny_extra: str = 'version = "1.0"', index: bool = False, standin: bool = False):
    """The given recipe (else `default`, from PyPI), or — in --quick without one, or with no
    default — the tiny recipe on the loopback index. `index=True` starts the index anyway (rows
    that stay offline); it is stopped on exit. `standin=True`: the index serves black's stand-in
    (black_standin) too, and `standin` is its recipe."""
    idx = None
    try:
        use_tiny = recipe is None and (quick or default is None)
        if index or use_tiny or standin:
            idx = quick_index(work / "wheels", [black_standin(work / "wheels")] if standin else [])
        tiny = tiny_recipe(work / "tiny.toml", extra=tiny_extra) if idx else None
        black = standin_recipe(work / "black-standin.toml") if standin else None
        if use_tiny:
            yield Packages(tiny, ["--index-url", idx.url], idx, tiny, black)
        else:
            yield Packages(recipe or default, [], idx, tiny, black)
    finally:
        if idx is not None:
            idx.stop()


def clone_registered(root: Path, src_name: str, n: int, tag: str = "") -> list[str]:
    """n copies (cp -a: no shared inodes) of store path `src_name`, each installed under a fresh key
    through the library's one way in (Store.install: renamed into store/, registered, its
    footprint recorded, as a build or a pull does), as paths nothing holds (`tag` makes another set)."""
    from llmgw_store.core import manifest
    from llmgw_store.core.keys import store_key
    from llmgw_store.core.local_store import Store
    from llmgw_store.core.pathinfo import StorePathInfo

    names = []
    with Store.open(root) as store:
        doc = manifest.read(store.layout.path_of(src_name))
        refs = store.index.references(src_name)
        for i in range(n):
            key = store_key({"bench": i, "src": src_name, **({"tag": tag} if tag else {})})
            name = f"{key}-{src_name.split('-', 1)[1]}"
            scratch = store.layout.tmp / f"bench-clone-{name}"
            subprocess.run(["cp", "-a", str(store.layout.path_of(src_name)), str(scratch)], check=True)
            b = store.index.start_build(key, name)
            info = StorePathInfo.from_manifest({**doc, "name": name, "key": key})
            store.install(scratch, replace(info, references=tuple(refs)), build_id=b)
            names.append(name)
    return names
