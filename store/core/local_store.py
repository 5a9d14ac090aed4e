"""A store on the local disk: its layout and its index, opened together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core.errors import NotFoundError
from llmgw_store.core.index import Index
from llmgw_store.core.layout import Layout


@dataclass
class Store:
    layout: Layout
    index: Index

    @classmethod
    def open(cls, root: str | Path | None = None, *, readonly: bool = False) -> "Store":
        """Open (and on first use create) the store at `root`. `readonly=True` is for commands that
        only look (list, info, stats, verify, generations): they create nothing, write nothing, and
        on a root that holds no store say so."""
        layout = Layout.at(root)
        if readonly:
            if not layout.db.is_file():
                raise NotFoundError(f"no store at {layout.root} (no index {layout.db}); "
                                    "build something first, or pass the right --root")
            return cls(layout, Index(layout.db, layout.store, readonly=True))
        layout.ensure()
        return cls(layout, Index(layout.db, layout.store))

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
