"""What a format-2 pull compares with its signed listing (tree_fetch._structure) on a real tree:
every entry below the tree with its kind, size and link target, sorted; a link to a directory is an
entry, never entered; a FIFO is an "o" entry, never opened; the tree's own manifest files left out."""

from __future__ import annotations

import os

from llmgw_store.cache.tree_fetch import _structure
from llmgw_store.core import manifest


def test_structure_lists_without_following(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    tree = tmp_path / "t"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("abc")
    (tree / "run").write_text("#!")
    os.chmod(tree / "run", 0o755)
    (tree / "pkg" / "link").symlink_to(outside)
    os.mkfifo(tree / "fifo")
    (tree / manifest.MANIFEST_DIR).mkdir()
    (tree / manifest.MANIFEST).write_text("{}")
    (tree / manifest.CONTENTS).write_text("")
    assert _structure(os.fspath(tree)) == sorted([
        (manifest.MANIFEST_DIR, "d", 0, ""),
        ("fifo", "o", 0, ""),
        ("pkg", "d", 0, ""),
        ("pkg/link", "l", 0, os.fspath(outside)),
        ("pkg/mod.py", "f", 3, ""),
        ("run", "x", 2, ""),
    ])
