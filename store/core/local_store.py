"""A store on the local disk: its layout and its index, opened together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core.index import Index
from llmgw_store.core.layout import Layout


@dataclass
class Store:
    layout: Layout
    index: Index

    @classmethod
    def open(cls, root: str | Path | None = None) -> "Store":
        layout = Layout.at(root)
        layout.ensure()
        return cls(layout, Index(layout.db, layout.store))

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
