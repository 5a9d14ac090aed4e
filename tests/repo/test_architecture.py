"""The library's shape (docs/architecture.md): layers with one-way imports, no cycles, no reaching
into another module's private names — imports inside functions included."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "store"


def _modules() -> dict[str, Path]:
    out = {}
    for f in STORE.rglob("*.py"):
        parts = list(f.relative_to(STORE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(["llmgw_store", *parts])] = f
    return out


def _imports(mods: dict[str, Path]) -> list[tuple[str, str, str | None]]:
    """(importer, imported module, imported name or None) for every import of the library."""
    found = []
    for mod, f in mods.items():
        package = mod if f.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                if not base.startswith("llmgw_store"):
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    found.append((mod, sub, None) if sub in mods else (mod, base, a.name))
            elif isinstance(node, ast.Import):
                found += [(mod, a.name, None) for a in node.names if a.name.startswith("llmgw_store")]
    return found


def test_no_module_imports_another_modules_private_names():
    mods = _modules()
    private = [f"{a} imports {b}.{n}" for a, b, n in _imports(mods) if n and n.startswith("_") and b != a]
    assert private == []


def test_no_import_cycle_between_modules():
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for a, b, _ in _imports(mods):
        if b in mods and b != a and not mods[b].name == "__init__.py":
            graph[a].add(b)
    # Tarjan's strongly connected components: a component of more than one module is a cycle.
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_checks_see_imports_inside_functions(tmp_path):
    """The walker above must see a function-level import, or it could pass on a cycle it cannot see."""
    mods = _modules()
    found = {(a, b) for a, b, _ in _imports(mods)}
    # api imports the builder at module level; gc's marking imports uv inside a function
    assert ("llmgw_store.api", "llmgw_store.build.builder") in found
    assert ("llmgw_store.roots.marking", "llmgw_store.build.uv") in found


def test_layers_contract_holds():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("import-linter is not installed: pip install -e '.[test]'")
    proc = subprocess.run([lint, "--config", str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def _layers() -> list[list[str]]:
    import tomllib

    conf = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [c for c in conf["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [[p.strip() for p in layer.split("|")] for layer in contract["layers"]]


def _floor(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_every_package_of_the_library_stands_on_a_floor():
    """A new package under store/ must be given its floor in the contract, or nothing checks its imports."""
    placed = {p for layer in _layers() for p in layer}
    packages = {f"llmgw_store.{d.name}" for d in STORE.iterdir() if (d / "__init__.py").is_file()}
    modules = {f"llmgw_store.{f.stem}" for f in STORE.glob("*.py") if f.name != "__init__.py"}
    assert packages | modules == placed


def test_below_the_store_model_two_levels_of_independent_floors():
    """core (the store model) stands on OS primitives, process supervision and application plumbing,
    which import nothing of each other; under all three, base (errors, progress, text, defaults)."""
    layers = _layers()
    core = layers.index(["llmgw_store.core"])
    assert layers[core + 1:] == [["llmgw_store.system", "llmgw_store.supervise", "llmgw_store.app"],
                                 ["llmgw_store.base"]]
    mods = _modules()
    lower = ("llmgw_store.system", "llmgw_store.supervise", "llmgw_store.app", "llmgw_store.base")
    crossing = sorted((a, b) for a, b, _ in _imports(mods) if a.startswith(lower)
                      and _floor(b) not in (_floor(a), "llmgw_store.base"))
    assert crossing == []


def test_sql_lives_in_the_index_modules_only():
    """The index's statements are in core/index.py and, for those the fast paths run, core/indexsql.py."""
    import re

    statement = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|REPLACE|WITH)\s.*\b(FROM|INTO|SET|TABLE|"
                           r"INDEX|VALUES)\b", re.S)
    found = []
    for mod, f in _modules().items():
        if mod in ("llmgw_store.core.index", "llmgw_store.core.indexsql"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and statement.match(node.value):
                found.append(f"{mod}:{node.lineno}: {node.value[:60]!r}")
    assert found == []
