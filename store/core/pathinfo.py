"""What is known of a store path, as one type: `StorePathInfo`. Every other shape of a store path is
made from it, and read into it, here:

    manifest        ROOT/store/<name>/.llmgw/manifest.json: `to_manifest` / `from_manifest`.
                    Format MANIFEST_FORMAT (the `format` field); a manifest without the field is
                    format 1 (written before the field existed: every store has them) and is read
                    the same way.
    index row       core/index.RegisteredPath, the `paths` row: `RegisteredPath.of` / `from_row`
    cache metadata  the fields of a store path that a cache object's signed metadata holds (both
                    formats): `cache_fields` (cache/push.py) / `from_cache_fields` (cache/pull.py,
                    after the signature; its Meta and MetaV2 hold the result, OfPath reads it).
                    The bytes a cache holds are the cache's own formats, signed: this gives the
                    values, never the encoding (tests/core/test_pathinfo.py pins the bytes).
    record          build/rebuild.Recorded holds one; roots/records.Record gives one (`info`:
                    identity, inputs and content hash; no sizes: a generation record has none),
                    and records.describe makes a new record's from the index row
    query row       integrity/queries.PathRow: the index row's columns and where the path lies

Invariants: `inputs` is always a dict (the index keeps it as canonical JSON text, parsed and
written at the SQL edge only); a StorePathInfo read from a manifest was checked field by field
(`from_manifest` is the parse edge: a manifest lies in a directory not yet trusted, or came from
a cache), so a shape made from it never meets a field of the wrong type or a name that is not a
store path name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from llmgw_store.core.keys import KEY_RE, is_store_name, key_of_name

MANIFEST_FORMAT = 2  # 1: no `format` field (before it existed); 2: `format` says so
MANIFEST_FORMATS = (1, 2)
# What a manifest must hold for its path to be registered (every field the index records).
REQUIRED = ("name", "key", "engine", "version", "variant", "content_hash", "size", "files", "build_seconds", "installed")
MAX_REFERENCES = 64
MAX_BYTES = 1 << 42  # 4 TiB: no environment is larger; a larger size or count is a malformed manifest
_SHORT = 200  # engine, version, variant, installed
_HEX64 = re.compile(r"[0-9a-f]{64}")
_KNOWN = frozenset((*REQUIRED, "inputs", "references", "format"))


class Whole(NamedTuple):
    """What a whole StorePathInfo (one a manifest or an index row can be made of) knows for sure."""

    engine: str
    version: str
    variant: str
    size: int
    files: int
    installed: str


@dataclass(frozen=True)
class StorePathInfo:
    """One store path: its identity (name, key, engine, version, variant), the inputs its key is the
    hash of, its content hash, and, where recorded, its sizes, references and build facts.
    `engine`, `version` and `variant` are None where nothing recorded them (a cache object's
    metadata); `size` and `files` None likewise (a generation record); `references` None where
    the manifest's were not a valid list (the caller reads them from pyvenv.cfg).
    `extra` is the rest of a manifest (requirements, lock text, the recipe's metadata), kept as
    written so that `to_manifest(from_manifest(doc))` is `doc` with its format."""

    name: str
    key: str
    content_hash: str
    engine: str | None = None
    version: str | None = None
    variant: str | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    size: int | None = None
    files: int | None = None
    references: tuple[str, ...] | None = ()
    build_seconds: float = 0.0
    installed: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    # --- what the index keeps in columns of its own, from the inputs ---------------------------

    @property
    def as_of(self) -> str | None:
        return _text_or_none(self.inputs.get("as_of"))

    @property
    def uv_version(self) -> str | None:
        return _text_or_none(self.inputs.get("uv", self.inputs.get("version")))

    @property
    def python(self) -> str | None:
        python = self.inputs.get("python")
        return _text_or_none(python.get("version")) if isinstance(python, dict) else None

    # --- the manifest --------------------------------------------------------------------------

    def whole(self, what: str = "an index row") -> Whole:
        """The fields a manifest and an index row need, each known; ValueError when one is not."""
        e, v, va, size, files, at = self.engine, self.version, self.variant, self.size, self.files, self.installed
        if e is None or v is None or va is None or size is None or files is None or at is None:
            raise ValueError(f"{self.name}: {what} needs its engine, version, variant, size, files and install time")
        return Whole(e, v, va, size, files, at)

    def to_manifest(self) -> dict[str, Any]:
        """The manifest document (core/manifest.write writes it sorted), in MANIFEST_FORMAT."""
        self.whole("a manifest")
        return {
            **self.extra,
            "format": MANIFEST_FORMAT,
            "name": self.name, "key": self.key, "engine": self.engine, "version": self.version,
            "variant": self.variant, "inputs": self.inputs, "content_hash": self.content_hash,
            "references": list(self.references or ()), "size": self.size, "files": self.files,
            "build_seconds": self.build_seconds, "installed": self.installed,
        }

    @classmethod
    def from_manifest(cls, doc: Any, name: str | None = None) -> StorePathInfo:
        """A manifest read from disk or a cache, checked: a JSON object of a format this llmgw-store
        reads, naming `name` (when given) and its key, with every REQUIRED field of its type and
        in its bounds. ValueError saying what is wrong (how the callers word a damaged path)."""
        if not isinstance(doc, dict):
            raise ValueError("its manifest is not a JSON object")
        fmt = doc.get("format", 1)
        if fmt not in MANIFEST_FORMATS or isinstance(fmt, bool):
            raise ValueError(f"its manifest is format {str(fmt)[:20]}, and this llmgw-store reads formats "
                             f"{', '.join(map(str, MANIFEST_FORMATS))}")
        if name is not None and (doc.get("name") != name or doc.get("key") != key_of_name(name)):
            raise ValueError("its manifest names another store path")
        missing = [f for f in REQUIRED if f not in doc]
        if missing:
            raise ValueError(f"its manifest lacks {', '.join(missing)}")
        if not is_store_name(doc["name"]) or not isinstance(doc["key"], str) or not KEY_RE.match(doc["key"]) \
                or key_of_name(doc["name"]) != doc["key"]:
            raise ValueError("its manifest's name is not a store path name of its key")
        for f in ("engine", "version", "variant", "installed"):
            if not isinstance(doc[f], str) or len(doc[f]) > _SHORT:
                raise ValueError(f"its manifest's {f} is not a string of at most {_SHORT} characters")
        if not isinstance(doc["content_hash"], str) or not _HEX64.fullmatch(doc["content_hash"]):
            raise ValueError("its manifest's content hash is not 64 hex digits")
        for f in ("size", "files"):
            if not _count(doc[f]):
                raise ValueError(f"its manifest's {f} is not a count between 0 and {MAX_BYTES}")
        seconds = doc["build_seconds"]
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds <= MAX_BYTES:
            raise ValueError("its manifest's build_seconds is not a number of seconds")
        inputs = doc.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise ValueError("its manifest's inputs are not a JSON object")
        return cls(
            name=doc["name"], key=doc["key"], engine=doc["engine"], version=doc["version"], variant=doc["variant"],
            content_hash=doc["content_hash"], inputs=inputs, size=doc["size"], files=doc["files"],
            references=_references(doc.get("references")), build_seconds=seconds, installed=doc["installed"],
            extra={k: v for k, v in doc.items() if k not in _KNOWN},
        )

    # --- the index row -------------------------------------------------------------------------

    # The `paths` row is made by core/index.RegisteredPath.of(info): the index imports this
    # module, never the other way (the index reads manifests: a cycle otherwise).

    @classmethod
    def from_row(cls, row, references: tuple[str, ...] | list[str] | None = ()) -> StorePathInfo:
        """What the index row `row` (core/index.RegisteredPath) records; its references, as the
        index's `refs` table has them, when the caller read them."""
        return cls(
            name=row.name, key=row.key, engine=row.engine, version=row.version, variant=row.variant,
            content_hash=row.content_hash, inputs=row.inputs, size=row.size, files=row.files,
            references=None if references is None else tuple(references), build_seconds=row.build_seconds,
            installed=row.created,
        )

    # --- a cache object's metadata -------------------------------------------------------------

    @classmethod
    def from_cache_fields(cls, doc: dict[str, Any], key: str, name: str | None) -> StorePathInfo:
        """The path a cache object's metadata describes, once its signature is checked and its
        fields have their types (cache/pull.py): bound to what was asked — the signed key is `key`,
        the signed name a store path name of it (and `name`, when one was asked) — its references
        store path names, its content hash 64 hex digits, its sizes bounded. ValueError saying what
        is wrong. `inputs` are as signed (a rebuild checks them against the key before any use)."""
        if doc["key"] != key:
            raise ValueError("it is signed for another key")
        if not is_store_name(doc["name"]) or key_of_name(doc["name"]) != key:
            raise ValueError("its signed name is not a store path name of that key")
        if name is not None and doc["name"] != name:
            raise ValueError(f"it is signed for {doc['name']}, not {name}")
        refs = _references(doc["references"])
        if refs is None:
            raise ValueError(f"its references are not a list of at most {MAX_REFERENCES} store path names")
        if not _HEX64.fullmatch(doc["content_hash"]):
            raise ValueError("its content hash is not 64 hex digits")
        if not all(_count(doc[f]) for f in ("size", "files")):
            raise ValueError(f"its sizes are not between 0 and {MAX_BYTES}")
        return cls(name=doc["name"], key=key, content_hash=doc["content_hash"], inputs=doc.get("inputs") or {},
                   size=doc["size"], files=doc["files"], references=refs)

    def cache_fields(self) -> dict[str, Any]:
        """The fields of this path that a cache object's metadata signs, in both formats
        (cache/push.py adds the object's own: archive or blobs, signatures)."""
        if self.size is None or self.files is None:
            raise ValueError(f"{self.name}: a cache object needs its size and files")
        return {"name": self.name, "key": self.key, "inputs": self.inputs, "content_hash": self.content_hash,
                "size": self.size, "files": self.files, "references": list(self.references or ())}


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BYTES


def _references(refs: Any) -> tuple[str, ...] | None:
    """A manifest's references when they are a list of at most MAX_REFERENCES store path names;
    else None (the caller reads them from the tree: manifest.references_of)."""
    if isinstance(refs, list) and len(refs) <= MAX_REFERENCES and all(is_store_name(r) for r in refs):
        return tuple(refs)
    return None


class OfPath:
    """What a shape holding a StorePathInfo as `info` (a cache object's checked metadata) reads of
    it by name, as its callers did when the shape had the fields itself."""

    info: StorePathInfo

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def key(self) -> str:
        return self.info.key

    @property
    def content_hash(self) -> str:
        return self.info.content_hash

    @property
    def size(self) -> int:
        return self.info.size or 0

    @property
    def files(self) -> int:
        return self.info.files or 0

    @property
    def references(self) -> tuple[str, ...]:
        return self.info.references or ()
