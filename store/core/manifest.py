"""The manifest inside each store path, its contents listing, and the content hash of a tree.

`ENV/.llmgw/manifest.json` says what the path is (engine, version, variant, the lock text, the key's
inputs) and carries the content hash of the rest of the tree; `ENV/.llmgw/contents` lists every
entry with its own hash, so `verify` can name the file that changed. The index is rebuilt from
manifests, so everything the index records about a path is in its manifest too.

The contents listing is canonical: one line per entry, sorted by path components, each
`kind <TAB> size <TAB> digest <TAB> path`, where kind is d (directory), f (file), x (file with the
exec bit), l (symlink; digest is its target) or o (anything else). Owners, times and permission
bits other than the exec bit are left out: they differ between machines and do not change what the
environment does. The content hash is blake3 of the listing, so it covers every byte of every file.
Files are hashed in a thread pool (blake3 releases the GIL), which is what makes verify fast on
trees of thousands of files.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blake3 import blake3

from llmgw_store.core.report import progress

MANIFEST_DIR = ".llmgw"
MANIFEST = f"{MANIFEST_DIR}/manifest.json"
CONTENTS = f"{MANIFEST_DIR}/contents"
_EXCLUDED = {MANIFEST, CONTENTS}
CHUNK = 1 << 20
THREADS = min(8, (os.cpu_count() or 1) * 2)
_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True)
class Entry:
    path: str
    kind: str
    size: int
    digest: str

    def line(self) -> str:
        return f"{self.kind}\t{self.size}\t{_esc(self.digest)}\t{_esc(self.path)}"

    @classmethod
    def parse(cls, line: str) -> "Entry":
        kind, size, digest, path = line.split("\t", 3)
        return cls(_unesc(path), kind, int(size), _unesc(digest))


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _unesc(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            out.append({"t": "\t", "n": "\n"}.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def file_digest(path: str | Path) -> str:
    """blake3 of the regular file at `path`, never through a symlink (OSError for a link, a FIFO,
    a device: what was listed as a file may have been swapped since)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        h = blake3()
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


BIG = 1 << 18  # files from 256 KiB up are hashed in the pool; smaller ones inline (less overhead)


def scan(root: Path, writable: list[str] | None = None) -> list[Entry]:
    """Every entry under `root` (manifest and listing excluded), in canonical order, files hashed.
    A depth-first walk over sorted names yields the component-wise sorted order directly. With
    `writable`, the paths of entries that have a write bit are appended to it (root itself as ".")."""
    from concurrent.futures import ThreadPoolExecutor

    entries: list[Entry] = []
    pending: list[tuple[int, Any]] = []
    check_w = writable is not None
    step, hashed = f"hashing {root.name}", [0]
    if check_w and os.lstat(root).st_mode & _WRITE:
        writable.append(".")
    with ThreadPoolExecutor(THREADS) as pool:

        def walk(dir_path: str, prefix: str) -> None:
            with os.scandir(dir_path) as it:
                children = sorted(it, key=lambda e: e.name)
            for e in children:
                rel = prefix + e.name
                if rel in _EXCLUDED:
                    continue
                st = e.stat(follow_symlinks=False)
                mode = st.st_mode
                if check_w and mode & _WRITE and not stat.S_ISLNK(mode):
                    writable.append(rel)
                if stat.S_ISREG(mode):
                    kind = "x" if mode & stat.S_IXUSR else "f"
                    size = st.st_size
                    hashed[0] += size
                    if len(entries) % 64 == 0 or size >= BIG:
                        progress(step, hashed[0], None, "B")
                    if size >= BIG:
                        pending.append((len(entries), pool.submit(file_digest, e.path)))
                        entries.append(Entry(rel, kind, size, ""))
                    else:
                        fd = os.open(e.path, os.O_RDONLY)
                        try:
                            data = os.read(fd, size + 1)
                        finally:
                            os.close(fd)
                        entries.append(Entry(rel, kind, size, blake3(data).hexdigest()))
                elif stat.S_ISDIR(mode):
                    entries.append(Entry(rel, "d", 0, ""))
                    walk(e.path, rel + "/")
                elif stat.S_ISLNK(mode):
                    entries.append(Entry(rel, "l", 0, os.readlink(e.path)))
                else:
                    entries.append(Entry(rel, "o", 0, ""))

        walk(os.fspath(root), "")
        for i, fut in pending:
            e = entries[i]
            entries[i] = Entry(e.path, e.kind, e.size, fut.result())
    progress(step, hashed[0], hashed[0], "B")
    return entries


def listing(entries: list[Entry]) -> bytes:
    return "".join(e.line() + "\n" for e in entries).encode()


def content_hash(entries: list[Entry]) -> str:
    return blake3(listing(entries)).hexdigest()


def tree_hash(root: Path) -> tuple[str, int, int]:
    """(content hash, bytes of regular files, number of entries) of the tree."""
    entries = scan(root)
    return content_hash(entries), sum(e.size for e in entries if e.kind in "fx"), len(entries)


def write_contents(env: Path, entries: list[Entry]) -> None:
    (env / CONTENTS).write_bytes(listing(entries))


def read_contents(env: Path) -> list[Entry]:
    # bytes, decoded: read_text() would translate "\r" and "\r\n" (universal newlines)
    return _parse_listing((env / CONTENTS).read_bytes().decode())


def _parse_listing(text: str) -> list[Entry]:
    # Lines end in "\n" only: the format escapes "\n", "\t" and "\\" in names, but a name may hold
    # any other character str.splitlines() would also break on ("\r", "\x0b", "\x85", U+2028...).
    return [Entry.parse(ln) for ln in text.split("\n") if ln]


def compare(recorded: list[Entry], actual: list[Entry]) -> dict[str, list[str]]:
    """What differs between a recorded listing and the tree now, by path."""
    want = {e.path: e for e in recorded}
    have = {e.path: e for e in actual}
    return {
        "modified": sorted(p for p in want.keys() & have.keys() if want[p] != have[p]),
        "missing": sorted(want.keys() - have.keys()),
        "extra": sorted(have.keys() - want.keys()),
    }


def write(env: Path, manifest: dict[str, Any]) -> None:
    (env / MANIFEST_DIR).mkdir(exist_ok=True)
    (env / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read(env: Path) -> dict[str, Any]:
    return json.loads((env / MANIFEST).read_text())


def references_of(tree: Path, store_dir: Path) -> list[str]:
    """Store paths an environment needs, recorded once at registration (as Nix records references):
    the interpreter its pyvenv.cfg names as `home`, when that lies in the store."""
    store = os.path.realpath(store_dir)
    refs = set()
    try:
        text = (tree / "pyvenv.cfg").read_text()
    except OSError:
        return []
    for line in text.splitlines()[:200]:
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = os.path.realpath(value.strip())
            if home.startswith(store + os.sep):
                refs.add(home[len(store) + 1:].split(os.sep)[0])
    return sorted(refs)


MANIFEST_MAX = 16 << 20  # a manifest holds one lock file and the key's inputs
CONTENTS_MAX = 512 << 20  # one line per entry: millions of files before this is reached
REQUIRED = ("name", "key", "engine", "version", "variant", "content_hash", "size", "files", "build_seconds", "installed")


def _read_meta_file(env: Path, name: str, limit: int) -> bytes:
    """`ENV/.llmgw/<name>` of a directory not yet trusted, without following a link at any step (a
    planted link could make this read a device, a FIFO or another user's file), at most `limit`
    bytes. Raises ValueError."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:
        fds.append(os.open(env, flags | os.O_DIRECTORY))
        fds.append(os.open(MANIFEST_DIR, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fds.append(os.open(name, flags | os.O_NONBLOCK, dir_fd=fds[-1]))
        st = os.fstat(fds[-1])
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{MANIFEST_DIR}/{name} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{MANIFEST_DIR}/{name} is larger than {limit} bytes")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fds[-1], min(CHUNK, left))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise ValueError(f"{MANIFEST_DIR}/{name} is larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise ValueError(f"cannot read {MANIFEST_DIR}/{name}: {exc.strerror}") from exc
    finally:
        for fd in reversed(fds):
            os.close(fd)


def check_complete(env: Path, name: str, *, rehash: bool) -> dict[str, Any]:
    """The manifest of `env`, once `env` is shown to be the complete store path `name`: a real
    directory whose manifest names `name` and its key and has every field the index records, whose
    contents listing hashes to the manifest's content hash and, with `rehash`, whose tree is what
    the listing says, byte for byte. Only a finished build writes that listing and that hash, so a
    directory that passes is complete whether or not the index knows it. Raises ValueError saying
    what is wrong."""
    from llmgw_store.core.keys import key_of_name

    doc_bytes = _read_meta_file(env, "manifest.json", MANIFEST_MAX)
    raw = _read_meta_file(env, "contents", CONTENTS_MAX)
    try:
        doc = json.loads(doc_bytes)
        entries = _parse_listing(raw.decode())
    except ValueError as exc:  # JSON, UTF-8 and listing lines alike
        raise ValueError(f"its manifest or contents listing is malformed ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("name") != name or doc.get("key") != key_of_name(name):
        raise ValueError("its manifest names another store path")
    missing = [f for f in REQUIRED if f not in doc]
    if missing:
        raise ValueError(f"its manifest lacks {', '.join(missing)}")
    if content_hash(entries) != doc["content_hash"]:
        raise ValueError("its contents listing does not hash to the manifest's content hash")
    if rehash:
        try:
            differs = compare(entries, scan(env))
        except OSError as exc:
            raise ValueError(f"its tree cannot be read: {exc}") from exc
        for kind, paths in differs.items():
            if paths:
                raise ValueError(f"its tree differs from its listing ({kind}: {paths[0]})")
    return doc
