"""Turning what a user types into a registered store path: a path, a name, a key, PROFILE or PROFILE@N."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from llmgw_store.core.errors import NotFoundError, UsageError
from llmgw_store.core.keys import KEY_RE
from llmgw_store.core.local_store import Store
from llmgw_store.core.names import check_generation, check_profile
from llmgw_store.roots.generations import current_generation, generation_target


def registered(store: Store, text: str | Path) -> dict[str, Any]:
    """The index row of a store path given as a path, its name or its bare key."""
    s = str(text).rstrip("/")
    name = Path(s).name
    row = store.index.path_by_name(name)
    if row is None and KEY_RE.match(name):
        row = store.index.path_by_key(name)
    if row is None and os.path.islink(s):  # a pin or generation link
        row = store.index.path_by_name(Path(os.readlink(s)).name)
    if row is None:
        raise NotFoundError(f"{text} is not a registered store path in {store.layout.store} (see `llmgw-store list`)")
    return row


def reference(store: Store, text: str) -> dict[str, Any]:
    """`PROFILE@N` (a generation), `PROFILE` (its current generation), or a store path, name or key."""
    profile, at, number = text.partition("@")
    if at:
        if not re.fullmatch(r"[0-9]{1,10}", number):
            raise UsageError(f"{text[:120]!r}: a generation is PROFILE@N with N a number")
        check_profile(profile)
        return registered(store, generation_target(store.layout, profile, check_generation(int(number))))
    if "/" not in text and (store.layout.profiles / text).is_symlink():
        current = current_generation(store.layout, text)
        return registered(store, generation_target(store.layout, text, current))
    return registered(store, text)
