"""What a command's library function returns: a frozen dataclass whose `to_json()` is the command's
`--json` document. The CLI formats its human text from the same object, so the two never disagree."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


def plain(value: Any) -> Any:
    """`value` with dataclasses, paths and tuples turned into what json.dumps takes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


@dataclasses.dataclass(frozen=True)
class Result:
    """Base of every command's result."""

    def to_json(self) -> Any:
        return plain(self)
