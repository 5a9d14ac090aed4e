"""Push: store paths (and what they reference) into a binary cache, signed.

    <key>.json       metadata: name, key inputs, content hash, sizes, compression, references,
                     the archive's sha256, and ed25519 signatures over all of that
    <key>.tar.zst    the store path as a tar stream, zstd-compressed

The metadata is written last: an object without it does not exist for pullers.
"""

from __future__ import annotations

import json
import os
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.cache.backends import backend_for
from llmgw_store.cache.signing import METADATA_MAX_BYTES, sign
from llmgw_store.core import debug, locks
from llmgw_store.core.errors import NotFoundError
from llmgw_store.core.fsutil import sha256_of
from llmgw_store.core.keys import canonical_json
from llmgw_store.core.local_store import Store
from llmgw_store.core.report import say
from llmgw_store.core.results import Result
from llmgw_store.core.temproots import TempRoots

ZSTD_LEVEL = 3


def _archive(tree: Path, name: str, out: Path) -> None:
    import zstandard

    with open(out, "wb") as raw:
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
        with cctx.stream_writer(raw) as zw, tarfile.open(fileobj=zw, mode="w|", format=tarfile.GNU_FORMAT) as tf:
            tf.add(tree, arcname=name)


@dataclass(frozen=True)
class PushResult(Result):
    pushed: tuple[str, ...]
    already_there: tuple[str, ...]
    to: str


def push(names: list[str], to: str, secret_key: str, *, root: str | Path | None = None,
         lock_timeout: float = locks.LOCK_TIMEOUT_S) -> PushResult:
    """Push the registered store paths `names` and their references (recorded at registration),
    references first. (`llmgw_store.api.push` turns PROFILE, PROFILE@N, keys and paths into names.)"""
    backend = backend_for(to)
    pushed, skipped = [], []
    with Store.open(root, lock_timeout) as store:
        for name in store.index.closure(names):
            # A temp root of this process from here on: a gc running meanwhile cannot take the path
            # while it is archived (it is checked again below, now that gc cannot).
            TempRoots(store.layout).add(name, lock_timeout)
            debug.pause("PUSH_PAUSE")
            row = store.index.path_by_name(name)
            if row is None:
                raise NotFoundError(f"{name} is not a registered store path in {store.layout.store}")
            key = row["key"]
            if backend.get(f"{key}.json", max_bytes=METADATA_MAX_BYTES) is not None:
                skipped.append(name)
                continue
            tree = store.layout.path_of(name)
            tmp = store.layout.tmp / f"push-{os.getpid()}-{key}.tar.zst"
            started = time.monotonic()
            try:
                _archive(tree, name, tmp)
                meta = {
                    "name": name, "key": key, "inputs": json.loads(row["inputs"]),
                    "content_hash": row["content_hash"], "size": row["size"], "files": row["files"],
                    "compression": "zstd", "archive": f"{key}.tar.zst", "archive_sha256": sha256_of(tmp),
                    "archive_size": tmp.stat().st_size,
                    "references": store.index.references(name),
                }
                sign(meta, secret_key)
                backend.put(meta["archive"], tmp)
                backend.put(f"{key}.json", canonical_json(meta))  # last: the object now exists
            finally:
                tmp.unlink(missing_ok=True)
            say(f"pushed {name} ({meta['archive_size'] / 1e6:.1f} MB compressed from {row['size'] / 1e6:.1f} MB "
                     f"in {time.monotonic() - started:.1f}s)")
            pushed.append(name)
    return PushResult(tuple(pushed), tuple(skipped), to)
