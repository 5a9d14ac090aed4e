"""The content-addressed cache object format (v2): what push writes, and the checks pull makes of it.

    <key>.json          signed metadata (format 2): name, key, inputs, content hash, size, entries,
                        references, and the digest, size and compressed size of three blobs:
                        `listing` (the store path's contents listing), `plan` (which blobs hold
                        which files) and `manifest` (its .llmgw/manifest.json)
    blobs/<digest>      one zstd frame each, shared by every object that holds the same bytes

The listing is the store's own `.llmgw/contents` (core/manifest.py): one line per entry with its
kind, size, blake3 digest (a link's target) and path. Its blake3 is the signed content hash, so
the listing blob is `blobs/<content_hash>` and the signed hash pins every file's digest.

A blob is either one file's bytes (named by that file's blake3) or a pack: the bytes of several
small files of one package directory, concatenated in the order the plan lists their digests, and
named by `pack_digest(members)` (blake3 over the member digests). A pack is checked member by
member (each member's blake3 against its digest), so no byte is trusted on the pack's name alone.
Packs keep a package's small files together, about PACK_AVG bytes each, cut where a file's own
digest says (content-defined): a package unchanged between two versions of an environment has the
same packs, and one of which a few files changed keeps every pack not next to them, so a node that
holds the older version fetches about what changed (issue 31). How a plan is cut is the pusher's
choice alone: a pull reads any plan whose packs are at most PACK_MAX (objects pushed with the 4 MiB
packs of before pull as they did).

Every check here is on bytes whose digest was verified against signed metadata already; the checks
still assume a hostile (compromised) signer: paths are lexically confined to the tree, sizes and
counts bounded, and the plan must cover every file exactly as the listing says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from blake3 import blake3

from llmgw_store.base.errors import IntegrityError
from llmgw_store.core.manifest import CONTENTS, MANIFEST, MANIFEST_DIR, Entry, refused_entry

FORMAT = 2
BLOB_ALONE = 256 << 10  # files from this size up are blobs of their own; smaller ones are packed
# A pack's bytes on average (content-defined boundaries; docs/design-notes.md has the measurement).
# Part of the format's determinism: every push of a path must make the same plan.
PACK_AVG = 32 << 10
PACK_TARGET = 1 << 20  # a pack is closed before it would hold more than this
PACK_MAX = 64 << 20  # a pack larger than this is refused (a pack is checked in memory)
MAX_ENTRIES = 5_000_000
MAX_FILE = 1 << 42
MAX_NAME_BYTES = 4096
MAX_COMPONENT_BYTES = 255
MAX_DEPTH = 128
HEX64 = re.compile(r"[0-9a-f]{64}")
EMPTY = blake3(b"").hexdigest()


def blob_name(digest: str) -> str:
    return f"blobs/{digest}"


def pack_digest(members: list[str]) -> str:
    return blake3(("pack\n" + "\n".join(members)).encode()).hexdigest()


def digest_of(data: bytes) -> str:
    return blake3(data).hexdigest()


def _group(path: str) -> str:
    """The package directory a file belongs to: `.../site-packages/<top>` for installed packages,
    else its parent directory."""
    parts = path.split("/")
    if "site-packages" in parts[:-1]:
        i = parts.index("site-packages")
        return "/".join(parts[: i + 2])
    return "/".join(parts[:-1])


@dataclass(frozen=True)
class Blob:
    digest: str  # its name under blobs/
    members: tuple[str, ...]  # the file digests it holds, in order (one: the blob is that file)
    size: int  # uncompressed bytes
    csize: int = 0  # compressed bytes, as stored

    @property
    def is_pack(self) -> bool:
        return len(self.members) != 1 or self.members[0] != self.digest


def _ends_pack(e: Entry) -> bool:
    """Whether a pack closes after `e`: content-defined, by the file's digest alone, with a chance of
    e.size / PACK_AVG (so packs hold PACK_AVG bytes on average). A file that changes, appears or goes
    moves only the boundaries next to it: every other pack of its package keeps its members and name."""
    return int(e.digest[:8], 16) * PACK_AVG < e.size << 32


def make_plan(entries: list[Entry]) -> list[Blob]:
    """Which blobs hold the files of `entries` (csize left 0): one per large file; the small files
    of each package directory, in listing order, packed with content-defined boundaries
    (`_ends_pack`, and before a file that would take a pack past PACK_TARGET); each distinct digest
    once, empty files in none."""
    seen: set[str] = set()
    alone: list[Blob] = []
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        if e.kind not in "fx" or e.size == 0 or e.digest in seen:
            continue
        seen.add(e.digest)
        if e.size >= BLOB_ALONE:
            alone.append(Blob(e.digest, (e.digest,), e.size))
        else:
            groups.setdefault(_group(e.path), []).append(e)
    packs: list[Blob] = []

    def close(chunk: list[Entry], total: int) -> None:
        if len(chunk) == 1:
            packs.append(Blob(chunk[0].digest, (chunk[0].digest,), chunk[0].size))
        elif chunk:
            ds = tuple(m.digest for m in chunk)
            packs.append(Blob(pack_digest(list(ds)), ds, total))

    for members in groups.values():
        chunk: list[Entry] = []
        total = 0
        for e in members:
            if chunk and total + e.size > PACK_TARGET:
                close(chunk, total)
                chunk, total = [], 0
            chunk.append(e)
            total += e.size
            if _ends_pack(e):
                close(chunk, total)
                chunk, total = [], 0
        close(chunk, total)
    return alone + packs


def plan_bytes(blobs: list[Blob]) -> bytes:
    return json.dumps({"blobs": [{"d": b.digest, "c": b.csize, "m": list(b.members) if b.is_pack else None}
                                 for b in blobs]}, separators=(",", ":"), sort_keys=True).encode()


# ---- checks of what a cache serves -------------------------------------------------------------

def _refuse(label: str, problem: str) -> IntegrityError:
    return IntegrityError(f"{label}: {problem}; refusing it")


def _check_path(path: str, label: str) -> None:
    if (not path or "\0" in path or path.startswith("/") or len(path.encode()) > MAX_NAME_BYTES
            or path.count("/") >= MAX_DEPTH):
        raise _refuse(label, f"its listing names a path that is empty, absolute or too long ({path[:200]!r})")
    for part in path.split("/"):
        if part in ("", ".", "..") or len(part.encode()) > MAX_COMPONENT_BYTES:
            raise _refuse(label, f"its listing names a path with an empty, '.' or '..' component ({path[:200]!r})")


def parse_line(line: str) -> Entry:
    """`Entry.parse`, without its per-character unescaping for the lines (nearly all) that hold no
    backslash. ValueError for a malformed line."""
    if "\\" in line:
        return Entry.parse(line)
    kind, size, digest, path = line.split("\t", 3)
    return Entry(path, kind, int(size), digest)


def read_listing(data: bytes) -> list[Entry]:
    """A contents listing this store wrote (core/manifest.py's format), parsed fast."""
    return [parse_line(ln) for ln in data.decode().split("\n") if ln]


def parse_listing(data: bytes, meta_size: int, meta_files: int, label: str) -> list[Entry]:
    """The entries of a listing blob (already checked against the signed content hash), each
    checked: a path lexically inside the tree whose parent is a directory listed before it (so
    nothing lies below a link or a file), no path twice, only files, directories and links, a file
    digest of 64 hex digits (that of the empty string for an empty file), and the totals equal
    the signed size and entry count."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise _refuse(label, "its listing is not UTF-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != meta_files or len(lines) > MAX_ENTRIES:
        raise _refuse(label, f"its listing has {len(lines)} entries, not the {meta_files} signed")
    entries: list[Entry] = []
    dirs: set[str] = {""}
    seen: set[str] = set()
    total = 0
    for line in lines:
        try:
            e = parse_line(line)
        except ValueError:
            raise _refuse(label, "its listing has a malformed line") from None
        path = e.path
        head, sep, base = path.rpartition("/")
        # A listed parent passed these checks already: only the last component is new. Anything
        # else takes the full check (and its message).
        if not (head in dirs and (head or not sep) and base not in ("", ".", "..") and "\0" not in base
                and len(base.encode()) <= MAX_COMPONENT_BYTES and len(path.encode()) <= MAX_NAME_BYTES
                and path.count("/") < MAX_DEPTH):
            _check_path(path, label)
        if e.path in seen:
            raise _refuse(label, f"its listing names {e.path[:200]!r} twice")
        seen.add(e.path)
        parent = e.path.rpartition("/")[0]
        if parent not in dirs:
            raise _refuse(label, f"its listing puts {e.path[:200]!r} below something that is not a directory "
                          "listed before it (a link, a file, or nothing)")
        if e.path in (MANIFEST, CONTENTS) or (e.path == MANIFEST_DIR and e.kind != "d"):
            raise _refuse(label, f"its listing names the store's own {e.path}")
        why = refused_entry(e)  # a link (or anything but a file) where the store writes or reads a file
        if why:
            raise _refuse(label, f"in its listing, {why}")
        if e.kind == "d":
            if e.size != 0 or e.digest:
                raise _refuse(label, f"its listing gives the directory {e.path[:200]!r} a size or digest")
            dirs.add(e.path)
        elif e.kind in "fx" and len(e.kind) == 1:
            if not 0 <= e.size <= MAX_FILE or not HEX64.fullmatch(e.digest) or (e.size == 0 and e.digest != EMPTY):
                raise _refuse(label, f"its listing gives {e.path[:200]!r} a bad size or digest")
            total += e.size
        elif e.kind == "l":
            if e.size != 0 or not e.digest or "\0" in e.digest or len(e.digest.encode()) > MAX_NAME_BYTES:
                raise _refuse(label, f"its listing gives the link {e.path[:200]!r} a bad target")
        else:
            raise _refuse(label, f"its listing has an entry of kind {e.kind[:8]!r} (only files, directories "
                          "and links are pulled)")
        entries.append(e)
    if total != meta_size:
        raise _refuse(label, f"its listing's files hold {total} bytes, not the {meta_size} signed")
    return entries


def parse_plan(data: bytes, entries: list[Entry], label: str) -> list[Blob]:
    """The blobs of a plan blob (already checked against its signed digest), checked against the
    listing: every file digest of a non-empty file is held by exactly one blob, each member is a
    file of the listing, a pack's name is the digest of its members and it holds at most PACK_MAX
    bytes, a blob's size is its members' sizes added up."""
    sizes: dict[str, int] = {}
    for e in entries:
        if e.kind in "fx" and e.size and sizes.setdefault(e.digest, e.size) != e.size:
            raise _refuse(label, "its listing gives one digest two sizes")
    try:
        doc = json.loads(data)
    except ValueError:
        raise _refuse(label, "its plan is not JSON") from None
    raw = doc.get("blobs") if isinstance(doc, dict) else None
    if not isinstance(raw, list) or len(raw) > len(sizes):
        raise _refuse(label, "its plan is not a list of at most one blob per file")
    held: set[str] = set()
    blobs: list[Blob] = []
    for b in raw:
        if not isinstance(b, dict):
            raise _refuse(label, "its plan has an entry that is not an object")
        d, c, m = b.get("d"), b.get("c"), b.get("m")
        if not isinstance(d, str) or not HEX64.fullmatch(d) or not isinstance(c, int) or isinstance(c, bool) \
                or not 0 <= c <= MAX_FILE:
            raise _refuse(label, "its plan has a blob with a bad digest or size")
        if m is None:
            members = (d,)
        elif isinstance(m, list) and 2 <= len(m) <= len(sizes) and all(isinstance(x, str) for x in m):
            members = tuple(m)
            if pack_digest(list(members)) != d:
                raise _refuse(label, "its plan names a pack by a digest that is not its members'")
        else:
            raise _refuse(label, "its plan has a pack whose members are not a list of digests")
        size = 0
        for x in members:
            if x not in sizes:
                raise _refuse(label, "its plan holds a file the listing does not list")
            if x in held:
                raise _refuse(label, "its plan holds one file in two blobs")
            held.add(x)
            size += sizes[x]
        if m is not None and size > PACK_MAX:
            raise _refuse(label, f"its plan has a pack of more than {PACK_MAX} bytes")
        blobs.append(Blob(d, members, size, c))
    if held != sizes.keys():
        raise _refuse(label, "its plan does not hold every file of the listing")
    return blobs


_V2_FIELDS = {"format": int, "name": str, "key": str, "content_hash": str, "size": int, "files": int,
              "references": list, "signatures": list, "listing": dict, "plan": dict, "manifest": dict}


def shape_v2(doc: dict[str, Any], label: str) -> None:
    for field, typ in _V2_FIELDS.items():
        value = doc.get(field)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise _refuse(label, f"metadata field {field!r} is missing or not a {typ.__name__}")
    if "inputs" in doc and not isinstance(doc["inputs"], dict):
        raise _refuse(label, "metadata field 'inputs' is not a dict")
    for part in ("listing", "plan", "manifest"):
        ref = doc[part]
        for f in ("size", "csize"):
            v = ref.get(f)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_FILE:
                raise _refuse(label, f"metadata field {part}.{f} is missing or not a size")
        if part != "listing" and not (isinstance(ref.get("digest"), str) and HEX64.fullmatch(ref["digest"])):
            raise _refuse(label, f"metadata field {part}.digest is not 64 hex digits")
