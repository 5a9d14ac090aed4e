"""Store keys: blake3 of the canonical form of everything that decides a build's result.

The canonical form is JSON with sorted keys and no whitespace, so two processes that agree on the
inputs agree on the key byte for byte. The digest is cut to 160 bits and written in Nix's base-32
alphabet (no e, o, u, t: no accidental words), 32 characters, exactly as Nix prints store hashes.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeGuard

from blake3 import blake3

SCHEMA_VERSION = 1
KEY_BYTES = 20
NIX_BASE32 = "0123456789abcdfghijklmnpqrsvwxyz"
# \A and \Z, not ^ and $: `$` also matches before a trailing newline, and "p\n" is not a name.
# Check names with llmgw_store.core.names, which also bounds their length.
KEY_RE = re.compile(rf"\A[{NIX_BASE32}]{{32}}\Z")
NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9._-]*\Z")
# A store path name: `<key>-<engine>-<version>-<variant>`, one path component (no separator, never
# `.` or `..`; versions may hold capitals, `+` and `!`), short enough to leave room under NAME_MAX
# (255) for `.partial`, a trash suffix and the lock and owner files beside it.
STORE_NAME_RE = re.compile(rf"\A[{NIX_BASE32}]{{32}}-[A-Za-z0-9._+!-]+\Z")
STORE_NAME_MAX = 200


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def nix_base32(digest: bytes) -> str:
    """Nix's printHash32: 5-bit groups taken from the end of the digest, least significant first
    (group n is bits 5n..5n+4 of the digest read as one little-endian number)."""
    length = (len(digest) * 8 - 1) // 5 + 1
    number = int.from_bytes(digest, "little")
    return "".join([NIX_BASE32[(number >> (5 * n)) & 0x1F] for n in range(length - 1, -1, -1)])


def store_key(inputs: dict[str, Any]) -> str:
    return nix_base32(blake3(canonical_json(inputs)).digest(length=KEY_BYTES))


def path_name(key: str, engine: str, version: str, variant: str) -> str:
    """`<key>-<engine>-<version>-<variant>`; every part is already checked against NAME_RE."""
    return f"{key}-{engine}-{version}-{variant}"


def is_store_name(name: object) -> TypeGuard[str]:
    """Whether `name` (from anywhere: a cache, a file, a user) is a well-formed store path name."""
    return isinstance(name, str) and len(name) <= STORE_NAME_MAX and STORE_NAME_RE.fullmatch(name) is not None


def key_of_name(name: str) -> str | None:
    """The key at the front of a store path name, or None when the name is not a store path's."""
    key = name[:32]
    return key if len(name) > 33 and name[32] == "-" and KEY_RE.match(key) else None
