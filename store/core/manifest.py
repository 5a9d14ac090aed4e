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


def file_digest(path: str) -> str:
    h = blake3()
    with open(path, "rb") as f:
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
    return [Entry.parse(ln) for ln in (env / CONTENTS).read_text().splitlines() if ln]


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
