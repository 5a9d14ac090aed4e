"""Read-only questions about the store: what it holds, and what one path is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result, plain
from llmgw_store.base.errors import NoStoreError
from llmgw_store.base.report import say
from llmgw_store.core import manifest
from llmgw_store.core.index import BuildLogEntry, RegisteredPath
from llmgw_store.core.local_store import Store
from llmgw_store.roots.resolve import reference


@dataclass(frozen=True)
class PathRow(Result):
    """One registered store path, as the index records it."""

    name: str
    path: str
    key: str
    engine: str
    version: str
    variant: str
    as_of: str | None
    uv_version: str | None
    python: str | None
    inputs: dict[str, Any]
    content_hash: str
    size: int
    files: int
    build_seconds: float
    created: str
    last_used: str

    @classmethod
    def of(cls, store: Store, row: RegisteredPath) -> PathRow:
        """The index row as `list` and `info` show it: every column, and where the path lies."""
        fields = {k: getattr(row, k) for k in cls.__dataclass_fields__ if k != "path"}
        return cls(path=str(store.layout.path_of(row.name)), **fields)


@dataclass(frozen=True)
class PathList(Result):
    paths: tuple[PathRow, ...]

    def body(self) -> dict[str, Any]:
        return {"paths": [p.body() for p in self.paths]}


@dataclass(frozen=True)
class PathInfo(Result):
    row: PathRow
    manifest: dict[str, Any] | None
    builds: tuple[BuildLogEntry, ...]

    def body(self) -> dict[str, Any]:
        return {**self.row.body(), "manifest": self.manifest, "builds": plain(self.builds)}


def list_paths(root: str | Path | None = None) -> PathList:
    try:
        store = Store.open(root, readonly=True)
    except NoStoreError as exc:
        say(exc.nothing_to("list"))
        return PathList(())
    with store:
        return PathList(tuple(PathRow.of(store, r) for r in store.index.paths()))


def path_info(target: str | Path, root: str | Path | None = None) -> PathInfo:
    """The index row and manifest of a store path: a path, its name, its key, PROFILE or PROFILE@N."""
    with Store.open(root, readonly=True) as store:
        row = PathRow.of(store, reference(store, str(target)))
        path = Path(row.path)
        return PathInfo(row, manifest.read(path) if path.is_dir() else None, tuple(store.index.builds(row.key)))
