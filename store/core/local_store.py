"""A store on the local disk: its layout and its index, opened together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core.index import BUSY_TIMEOUT_S, Index
from llmgw_store.core.layout import Layout


@dataclass
class Store:
    layout: Layout
    index: Index

    @classmethod
    def open(cls, root: str | Path | None = None, lock_timeout: float = BUSY_TIMEOUT_S) -> "Store":
        """Check (or make) the store's directories, then open its index. Waits on the index's SQLite
        locks never outlast `lock_timeout` (the command's --lock-timeout)."""
        layout = Layout.at(root)
        layout.ensure()
        return cls(layout, Index(layout.db, layout.store, busy_timeout=lock_timeout))

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
