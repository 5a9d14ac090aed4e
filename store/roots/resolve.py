"""Turning what a user types into a registered store path: the one function every command that takes
a path argument calls (info, pin, diff, push, verify, run, env, activate).

    PROFILE@N        generation N of PROFILE
    PROFILE          PROFILE's current generation
    <key>-<name>     a store path's name            (as `list` prints it)
    <key>            its bare 32-character key
    PATH             a store path, or a link to one (a profile, a generation, a pin), as a path

A text is tried in that order. Nothing is created, and the answer is always a row of the index:
a directory that merely looks like a store path is not one until it is registered. The text is
untrusted: bounded in length, and only ever looked up (a name in the index, one readlink chain),
never opened.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from llmgw_store.base.errors import NotFoundError, UsageError
from llmgw_store.base.text import shown
from llmgw_store.core.index import RegisteredPath
from llmgw_store.core.keys import KEY_RE, is_store_name
from llmgw_store.core.local_store import Store
from llmgw_store.core.names import check_generation, check_profile
from llmgw_store.roots.generations import current_generation, generation_target

PATH_MAX = 4096
_GENERATION = re.compile(r"([^/@]+)@([0-9]{1,10})")


def registered(store: Store, text: str | Path) -> RegisteredPath:
    """The index row of a store path given as a path (or a link to one), its name or its bare key."""
    s = _checked(text).rstrip("/")
    name = Path(s).name
    row = store.index.path_by_name(name) if is_store_name(name) else None
    if row is None and KEY_RE.fullmatch(name):
        row = store.index.path_by_key(name)
    if row is None and "/" in s:
        try:
            if os.path.islink(s):  # a profile, a generation link, a pin, or another link to a store path
                row = store.index.path_by_name(Path(os.path.realpath(s)).name)
        except (OSError, ValueError):
            row = None
    if row is None:
        raise NotFoundError(f"{_said(str(text))} is not a registered store path in {store.layout.store} "
                            "(see `llmgw-store list`)")
    return row


def reference(store: Store, text: str | Path) -> RegisteredPath:
    """`PROFILE@N` (a generation), `PROFILE` (its current generation), or a store path, name or key."""
    s = _checked(text)
    m = _GENERATION.fullmatch(s)
    if m:
        profile = check_profile(m.group(1))
        return registered(store, generation_target(store.layout, profile, check_generation(int(m.group(2)))))
    if "@" in s and "/" not in s:
        raise UsageError(f"{shown(s)}: a generation is PROFILE@N with N a number")
    if is_profile(store, s):
        return registered(store, generation_target(store.layout, s, current_generation(store.layout, s)))
    try:
        return registered(store, s)
    except NotFoundError:
        if "/" in s or is_store_name(s) or KEY_RE.fullmatch(s):
            raise
        raise NotFoundError(f"{_said(s)} is neither a profile nor a registered store path in {store.layout.root} "
                            "(see `llmgw-store list-profiles` and `llmgw-store list`)") from None


def is_profile(store: Store, text: str) -> bool:
    """Whether `text` names an existing profile of this store."""
    try:
        check_profile(text)
    except UsageError:
        return False
    return (store.layout.profiles / text).is_symlink()


def _said(text: str) -> str:
    """`text` as typed when it is short and printable, else quoted and cut short (names.shown)."""
    return text if len(text) <= 300 and text.isprintable() else shown(text, 120)


def _checked(text: str | Path) -> str:
    s = os.fspath(text)
    if not isinstance(s, str) or not s or len(s) > PATH_MAX or "\0" in s:
        raise UsageError(f"{shown(s)} is not a store path, its name or key, PROFILE or PROFILE@N")
    return s
