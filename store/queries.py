"""Read-only questions about the store: what it holds, and what one path is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import manifest
from .errors import NotFoundError
from .keys import key_of_name
from .local_store import Store


def list_paths(root: str | Path | None = None) -> list[dict[str, Any]]:
    with Store.open(root) as store:
        rows = store.index.paths()
        for row in rows:
            row["path"] = str(store.layout.path_of(row["name"]))
            row["inputs"] = json.loads(row["inputs"])
        return rows


def path_info(target: str | Path, root: str | Path | None = None) -> dict[str, Any]:
    """The index row and manifest of a store path, named by its path, its name or its key."""
    with Store.open(root) as store:
        text = str(target).rstrip("/")
        name = Path(text).name
        row = store.index.path_by_name(name)
        if row is None and key_of_name(name + "-x") == name:  # a bare key
            row = store.index.path_by_key(name)
        if row is None:
            raise NotFoundError(f"{target} is not a registered store path in {store.layout.store} (see `llmgw-store list`)")
        path = store.layout.path_of(row["name"])
        row["path"] = str(path)
        row["inputs"] = json.loads(row["inputs"])
        row["manifest"] = manifest.read(path) if path.is_dir() else None
        row["builds"] = store.index.builds(row["key"])
        return row
