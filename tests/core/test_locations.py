"""The one table of locations under ROOT (core/locations.py): README's "On disk" lists exactly its
locations, Layout is a view of it, and no module of the library spells a location of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from llmgw_store.core import locations as loc
from llmgw_store.core.layout import Layout
from tests.conftest import REPO


def _on_disk() -> list[str]:
    """The locations README.md's "On disk" block names (the first column, continuation lines aside)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## On disk", 1)[1].split("```", 2)[1]
    return [re.split(r"\s{2,}", line, maxsplit=1)[0] for line in block.splitlines() if line.startswith("ROOT/")]


def test_readme_on_disk_lists_every_location_of_the_table_and_no_other():
    listed = _on_disk()
    table = ["ROOT/" + shown for shown, _ in loc.TABLE]
    assert sorted(set(listed)) == sorted(listed), "a location listed twice"
    assert set(listed) - set(table) == set(), "README names a location the table lacks"
    assert set(table) - set(listed) == set(), "README omits a location of the table"
    for must in ("ROOT/store/.wheels/<id>/", "ROOT/var/wheels/<id>", "ROOT/var/memo/<digest>", "ROOT/var/used/<name>",
                 "ROOT/var/trash/", "ROOT/var/tmp/"):
        assert must in listed


def test_every_directory_the_store_checks_is_in_the_table():
    shown = {s for s, _ in loc.TABLE}
    for rel, _mode in loc.DIRS:
        if rel:
            assert any(s == rel + "/" or s.startswith(rel + "/") for s in shown), rel


def test_layout_is_a_view_of_the_table(tmp_path):
    layout = Layout.at(tmp_path)
    assert layout.dir_modes() == [(tmp_path / rel if rel else tmp_path, mode) for rel, mode in loc.DIRS]
    for attr, rel in (("store", loc.STORE), ("db", loc.DB), ("memo", loc.MEMO), ("used", loc.USED),
                      ("ops", loc.OPS), ("roots_seq", loc.ROOTS_SEQ), ("records_key", loc.RECORDS_KEY),
                      ("pyc_secret", loc.PYC_KEY), ("holds", loc.HOLDS), ("wheel_home", loc.WHEEL_HOME)):
        assert getattr(layout, attr) == tmp_path / rel == Path(loc.at(str(tmp_path), rel))
    assert layout.generation_link("p", 7) == tmp_path / "profiles" / "p-7-link"


@pytest.mark.parametrize("name, split", [
    ("p-1-link", ("p", 1)), ("a-1-2-link", ("a-1", 2)), ("p-007-link", ("p", 7)), ("-1-link", None),
    ("p--link", None), ("p-x-link", None), ("p\n-1-link", None), ("p-1-linkx", None), ("vllm", None),
])
def test_a_generation_link_name_is_read_as_gc_always_read_it(name, split):
    """As wide as the pattern gc held every generation with, `(.+)-(\\d+)-link`: nothing gc kept it
    drops now."""
    old = re.fullmatch(r"(.+)-(\d+)-link", name)
    assert loc.split_generation_link(name) == split == ((old.group(1), int(old.group(2))) if old else None)
    if split:
        assert loc.generation_of(split[0], name) == split[1]
        assert loc.generation_of(split[0] + "x", name) is None


# Strings that are a location under ROOT, or a piece of one (`root + "/var/locks"`, f"{p}-{n}-link"),
# outside core/locations.py; /var/lib, /var/cache (a default root, XDG's) are not under ROOT.
_SPELLED = re.compile(r"^/?var/(?!lib/|cache/)|^-link$|\}-link$|^(db\.sqlite|records\.key|pyc-cache\.key|roots-seq"
                      r"|gc-reserve|seen\.json|lockproofs)$")


def _strings(tree: ast.AST):
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_module_spells_a_location_of_its_own():
    found = []
    for f in sorted((REPO / "store").rglob("*.py")) + sorted((REPO / "cli").rglob("*.py")):
        if f.name == "locations.py":
            continue
        for line, value in _strings(ast.parse(f.read_text())):
            if _SPELLED.search(value):
                found.append(f"{f.relative_to(REPO)}:{line}: {value!r}")
    assert found == []


def test_the_check_sees_a_spelled_location(tmp_path):
    tree = ast.parse('"""var/memo in a docstring is prose."""\nx = f"{p}-{n}-link"\ny = root / "var/memo"\n')
    assert [v for _, v in _strings(tree) if _SPELLED.search(v)] == ["-link", "var/memo"]
