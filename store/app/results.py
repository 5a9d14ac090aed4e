"""What a command's library function returns: a frozen dataclass whose `to_json()` is the command's
`--json` document. The CLI formats its human text from the same object, so the two never disagree.

The documents' contract (docs/json.md): every document is a JSON object whose first key a script
can check is `schema_version` (SCHEMA_VERSION; raised only when a key changes meaning or goes
away — new keys may appear at any time); keys are machine words (`uv_version`, `kind`/`pid`),
never prose; sizes are bytes and times ISO 8601 UTC or seconds. A result that nests another
(a switch's check) nests its `body()`, without a second schema version.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


_LEAVES = frozenset((str, int, float, bool, type(None)))
_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass's field names, looked up once per class


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def plain(value: Any) -> Any:
    """`value` with dataclasses, paths and tuples turned into what json.dumps takes; a nested
    result (anything with a `body()`) as its body."""
    if type(value) in _LEAVES:  # most of a document: nothing to turn
        return value
    body = getattr(value, "body", None)
    if callable(body) and not isinstance(value, type):
        return body()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: plain(getattr(value, name)) for name in _names(type(value))}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def fields_of(value: Any) -> dict[str, Any]:
    """A dataclass's fields, each made plain: the default body of a result."""
    return {name: plain(getattr(value, name)) for name in _names(type(value))}


def document(body: dict[str, Any]) -> dict[str, Any]:
    """A `--json` document: `body` with the schema version first."""
    return {"schema_version": SCHEMA_VERSION, **body}


@dataclasses.dataclass(frozen=True)
class Result:
    """Base of every command's result. A subclass whose document is not simply its fields
    overrides `body()` (always an object: a list goes under a key that names it)."""

    def body(self) -> dict[str, Any]:
        return fields_of(self)

    def to_json(self) -> dict[str, Any]:
        return document(self.body())
