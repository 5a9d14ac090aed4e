"""Read-only questions about the store: what it holds, and what one path is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmgw_store.core import manifest
from llmgw_store.core.local_store import Store


def list_paths(root: str | Path | None = None) -> list[dict[str, Any]]:
    with Store.open(root, readonly=True) as store:
        rows = store.index.paths()
        for row in rows:
            row["path"] = str(store.layout.path_of(row["name"]))
            row["inputs"] = json.loads(row["inputs"])
        return rows


def path_info(target: str | Path, root: str | Path | None = None) -> dict[str, Any]:
    """The index row and manifest of a store path: a path, its name, its key, PROFILE or PROFILE@N."""
    from llmgw_store.roots.resolve import reference

    with Store.open(root, readonly=True) as store:
        row = reference(store, str(target))
        path = store.layout.path_of(row["name"])
        row["path"] = str(path)
        row["inputs"] = json.loads(row["inputs"])
        row["manifest"] = manifest.read(path) if path.is_dir() else None
        row["builds"] = store.index.builds(row["key"])
        return row
