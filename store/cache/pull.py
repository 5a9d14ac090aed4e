"""Pull: fetch a signed store path (and what it references) from binary caches into this store.

Trust: a puller accepts an object only if one of its trusted public keys signed the metadata, the
archive's sha256 matches the metadata, and the unpacked tree's content hash matches the metadata;
then it registers the path like a build would (frozen, renamed into place, one transaction). A
compromised cache can withhold objects or serve stale ones it once had signed; it cannot make a
node install bytes no trusted key signed.

`CacheSubstituter` is what `build --substituter` asks before building (the build layer's
`Substituter` interface).
"""

from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any, Callable

from llmgw_store.cache.backends import backend_for
from llmgw_store.cache.signing import check_signature, trusted_keys
from llmgw_store.core import locks, manifest
from llmgw_store.core.errors import IntegrityError, NotFoundError, StoreError, UsageError
from llmgw_store.core.fsutil import force_rmtree, sha256_of
from llmgw_store.core.index import row_from_manifest
from llmgw_store.core.keys import KEY_RE
from llmgw_store.core.local_store import Store
from llmgw_store.core.temproots import TempRoots


def _quiet(_: str) -> None:
    pass


def _find_meta(backends, target: str) -> tuple[Any, dict[str, Any]]:
    key = target if KEY_RE.match(target) else Path(target).name[:32]
    if not KEY_RE.match(key):
        raise UsageError(f"{target!r} is neither a store key nor a store path name")
    for b in backends:
        data = b.get(f"{key}.json")
        if data is not None:
            try:
                return b, json.loads(data)
            except ValueError as exc:
                raise IntegrityError(f"{key}.json is not valid JSON: {exc}") from None
    raise NotFoundError(f"no cache has {key}")


def _check_relocatable(tree: Path, name: str) -> None:
    """The environment must find its interpreter here: pyvenv.cfg's home must hold a python."""
    cfg = tree / "pyvenv.cfg"
    if not cfg.exists():
        return
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip())
            if not any((home / p).exists() for p in ("python3", "python")):
                raise UsageError(f"{name}: its interpreter {home} does not exist on this machine; install that "
                                 "Python there (or build the recipe locally)")


def _unsafe_member(m: tarfile.TarInfo, name: str, symlinks: set[str]) -> str | None:
    """Environments hold absolute symlinks (bin/python -> the interpreter), and those are signed
    and hashed like any entry; what must never happen is a write outside the tree: no absolute or
    `..` names, nothing outside `name/`, no hardlink out, no devices, and no member below a symlink
    the archive made (a write through it)."""
    parts = Path(m.name).parts
    if m.name.startswith("/") or ".." in parts:
        return "has an absolute or .. path"
    if not parts or parts[0] != name:
        return f"is outside {name}"
    if m.isdev() or m.isfifo():
        return "is a device or special file"
    if m.islnk() and (Path(m.linkname).is_absolute() or ".." in Path(m.linkname).parts
                      or Path(m.linkname).parts[:1] != (name,)):
        return f"hardlinks out of the tree ({m.linkname})"
    if any("/".join(parts[:i]) in symlinks for i in range(1, len(parts))):
        return "would be written through a symlink"
    if m.issym():
        symlinks.add("/".join(parts))
    return None


def _zstd_stream(archive: Path):
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(open(archive, "rb"), closefd=True)


def _check_members(archive: Path, name: str, label: str) -> None:
    """Every member is checked before a byte is written (one pass over the headers)."""
    symlinks: set[str] = set()
    with _zstd_stream(archive) as zr, tarfile.open(fileobj=zr, mode="r|") as tf:
        for m in tf:
            problem = _unsafe_member(m, name, symlinks)
            if problem:
                raise IntegrityError(f"{label}: member {m.name!r} {problem}; refusing it")


def _extract(archive: Path, dest: Path) -> None:
    """GNU tar extracts (it is several times faster than tarfile on trees of thousands of files and
    restores read-only directories last); the stream is decompressed here, so no zstd binary is
    needed. Ownership is not restored: the files belong to whoever runs the store."""
    import shutil
    import subprocess

    tar = shutil.which("tar")
    if tar is None:
        raise UsageError("pulling needs GNU tar on PATH")
    proc = subprocess.Popen([tar, "-x", "-f", "-", "-C", str(dest), "--no-same-owner", "--delay-directory-restore"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with _zstd_stream(archive) as zr:
            shutil.copyfileobj(zr, proc.stdin, 1 << 20)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    err = proc.stderr.read().decode(errors="replace")
    if proc.wait() != 0:
        raise IntegrityError(f"{archive.name}: tar failed: {err.strip()[-300:]}")


def fetch_into_store(store: Store, backend, meta: dict[str, Any], trusted: dict[str, bytes],
                     progress: Callable[[str], None]) -> Path:
    """Download, check and register one object. Caller holds the key's lock (or is pull)."""
    signer = check_signature(meta, trusted)
    name, key = meta["name"], meta["key"]
    if not name.startswith(key + "-"):
        raise IntegrityError(f"{key}.json names {name!r}, which is not a path of that key; refusing it")
    layout = store.layout
    final = layout.path_of(name)
    scratch = layout.tmp / f"pull-{os.getpid()}-{key}"
    archive = layout.tmp / f"pull-{os.getpid()}-{key}.tar.zst"
    build_id = store.index.start_build(key, name)
    started = time.monotonic()
    try:
        force_rmtree(scratch)
        backend.get(meta["archive"], dest=archive)
        if sha256_of(archive) != meta["archive_sha256"]:
            raise IntegrityError(f"{meta['archive']}: sha256 differs from the signed metadata; refusing it")
        scratch.mkdir(parents=True)
        _check_members(archive, name, meta["archive"])
        _extract(archive, scratch)
        tree = scratch / name
        entries = manifest.scan(tree)
        if manifest.content_hash(entries) != meta["content_hash"]:
            raise IntegrityError(f"{name}: the unpacked tree's content hash differs from the signed metadata; refusing it")
        doc = manifest.read(tree)
        if doc.get("content_hash") != meta["content_hash"] or doc.get("key") != key:
            raise IntegrityError(f"{name}: its manifest does not match the signed metadata; refusing it")
        _check_relocatable(tree, name)
        os.rename(tree, final)  # atomic, same filesystem: complete or absent
    except BaseException as exc:
        store.index.fail_build(build_id, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        force_rmtree(scratch)
        archive.unlink(missing_ok=True)
    refs = doc.get("references")
    store.index.register(row_from_manifest(doc), build_id, round(time.monotonic() - started, 3),
                         refs if refs is not None else manifest.references_of(final, layout.store), outcome="substituted")
    progress(f"substituted {name} from the cache (signed by {signer}) in {time.monotonic() - started:.1f}s")
    return final


def pull(target: str, from_: list[str], trusted: list[str], *, root: str | Path | None = None,
         lock_timeout: float = locks.BUILD_LOCK_TIMEOUT_S, progress: Callable[[str], None] = _quiet) -> dict[str, Any]:
    backends = [backend_for(u) for u in from_]
    keys = trusted_keys(trusted)
    pulled, present = [], []
    with Store.open(root, lock_timeout) as store:

        def one(t: str) -> None:
            backend, meta = _find_meta(backends, t)
            for ref in meta.get("references", []):
                one(ref)
            name = meta["name"]
            if store.index.path_by_key(meta["key"]) and store.layout.path_of(name).is_dir():
                present.append(name)
                return
            TempRoots(store.layout).add(name, lock_timeout, progress)
            with locks.hold(store.layout.locks, meta["key"], f"pulling {name}", lock_timeout, progress):
                if store.index.path_by_key(meta["key"]) and store.layout.path_of(name).is_dir():
                    present.append(name)
                    return
                fetch_into_store(store, backend, meta, keys, progress)
                pulled.append(name)

        one(target)
        return {"pulled": pulled, "already_present": present,
                "path": str(store.layout.path_of((pulled or present)[-1]))}


class CacheSubstituter:
    """The build layer's `Substituter`: asks each binary cache for the key before a build. A cache
    that is down, lacks the key or serves something that fails a check is passed over (said on
    stderr); the build goes on locally."""

    def __init__(self, urls: list[str] | tuple[str, ...], trusted: list[str] | tuple[str, ...]):
        self.urls, self.keys = tuple(urls), trusted_keys(trusted)

    def substitute(self, store: Store, key: str, name: str, progress: Callable[[str], None]) -> bool:
        for url in self.urls:
            try:
                backend = backend_for(url)
                data = backend.get(f"{key}.json")
                if data is None:
                    continue
                fetch_into_store(store, backend, json.loads(data), self.keys, progress)
                return True
            except (StoreError, ValueError) as exc:
                progress(f"cache {url}: {exc}; building instead")
        return False
