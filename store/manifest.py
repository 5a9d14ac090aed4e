"""The manifest inside each store path, and the content hash of a tree.

`ENV/.llmgw/manifest.json` says what the path is (engine, version, variant, the lock text, the key's
inputs) and carries a blake3 hash of the rest of the tree. The index is rebuilt from manifests, so
everything the index records about a path is in its manifest too.

Content hash: blake3 over a canonical walk — entries sorted by name (bytes), each contributing its
relative path, its type (file, exec file, symlink, directory), and its content or link target. Mode
bits other than the exec bit, owners and times are left out: they differ between machines and do
not change what the environment does.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from blake3 import blake3

MANIFEST_DIR = ".llmgw"
MANIFEST = f"{MANIFEST_DIR}/manifest.json"
CHUNK = 1 << 20


def tree_hash(root: Path) -> tuple[str, int, int]:
    """(blake3 hex, bytes of regular files, number of entries) of the tree, manifest excluded."""
    h = blake3()
    total = 0
    count = 0
    root_s = os.fsencode(root)
    stack = [b""]
    while stack:
        rel_dir = stack.pop()
        full_dir = os.path.join(root_s, rel_dir) if rel_dir else root_s
        with os.scandir(full_dir) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs = []
        for e in entries:
            rel = os.path.join(rel_dir, e.name) if rel_dir else e.name
            if rel == os.fsencode(MANIFEST):
                continue
            st = e.stat(follow_symlinks=False)
            count += 1
            if stat.S_ISLNK(st.st_mode):
                h.update(b"l\0" + rel + b"\0" + os.readlink(e.path) + b"\0")
            elif stat.S_ISDIR(st.st_mode):
                h.update(b"d\0" + rel + b"\0")
                subdirs.append(rel)
            elif stat.S_ISREG(st.st_mode):
                kind = b"x" if st.st_mode & stat.S_IXUSR else b"f"
                h.update(kind + b"\0" + rel + b"\0" + str(st.st_size).encode() + b"\0")
                with open(e.path, "rb") as f:
                    while chunk := f.read(CHUNK):
                        h.update(chunk)
                total += st.st_size
            else:
                h.update(b"o\0" + rel + b"\0")
        # Depth-first in sorted order: push in reverse so the smallest name is walked first.
        stack.extend(reversed(subdirs))
    return h.hexdigest(), total, count


def write(env: Path, manifest: dict[str, Any]) -> None:
    (env / MANIFEST_DIR).mkdir(exist_ok=True)
    (env / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read(env: Path) -> dict[str, Any]:
    return json.loads((env / MANIFEST).read_text())
