"""`optimise`: hardlink identical files across store paths, as Nix's optimise-store does.

Every regular file of a registered path is linked from a content-addressed pool
`ROOT/store/.links/<blake3>-<f|x>` (the exec bit is part of an inode, so it is part of the name).
A file whose content is already in the pool under another inode is replaced by a link to the pool
entry: a new link is made beside it and renamed over it (atomic: the file is never missing). Its
directory is made writable for that moment and frozen again. Files stay read-only throughout.

Digests come from each path's `.llmgw/contents`; a file whose size differs from its listing is
left alone (`verify` reports it). gc removes pool entries that no store path links any more.

Environments already share the files of the wheels they have in common through the uv cache
(installed by hardlink); what optimise adds is everything else that is identical — compiled
bytecode (path-independent, see bytecode.py), the venv's scripts, dist-info files — and wheels
installed at different times through different caches.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Callable

from llmgw_store.core import manifest
from llmgw_store.core.fsutil import WRITE_BITS
from llmgw_store.core.local_store import Store
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.temproots import gc_lock



def _quiet(_: str) -> None:
    pass


def optimise(*, root: str | Path | None = None, dry_run: bool = False, lock_timeout: float = LOCK_TIMEOUT_S,
             progress: Callable[[str], None] = _quiet) -> dict[str, Any]:
    with Store.open(root, lock_timeout) as store:
        pool = store.layout.links_pool
        pool.mkdir(exist_ok=True)
        linked = saved = examined = 0
        # Shared gc lock: gc (exclusive) cannot prune the pool or delete a path under us; builds and
        # activations (also shared) go on.
        with gc_lock(store.layout, shared=True, timeout=lock_timeout, what="optimising", progress=progress):
            for row in store.index.paths():
                env = store.layout.path_of(row["name"])
                try:
                    entries = manifest.read_contents(env)
                except OSError:
                    continue
                n_linked, n_saved = 0, 0
                for e in entries:
                    if e.kind not in "fx" or e.size == 0:
                        continue
                    examined += 1
                    done, freed = _share(env / e.path, pool / f"{e.digest}-{e.kind}", e.size, dry_run)
                    n_linked += done
                    n_saved += freed
                if n_linked:
                    progress(f"{row['name']}: {n_linked} file(s) {'would be ' if dry_run else ''}linked, "
                             f"{n_saved / 1e6:.1f} MB {'would be ' if dry_run else ''}freed")
                linked += n_linked
                saved += n_saved
        return {"files_examined": examined, "files_linked": linked, "bytes_saved": saved, "dry_run": dry_run}


def _share(path: Path, pool_entry: Path, size: int, dry_run: bool) -> tuple[int, int]:
    """(1 if `path` was (or would be) replaced by a link to the pool entry, bytes that freed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0, 0
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return 0, 0
    try:
        pst = os.lstat(pool_entry)
    except FileNotFoundError:
        if not dry_run:
            os.link(path, pool_entry)  # this inode becomes the pool's copy
        return 0, 0
    if pst.st_ino == st.st_ino and pst.st_dev == st.st_dev:
        return 0, 0
    freed = size if st.st_nlink == 1 else 0  # other links (the uv cache, another path) keep it alive
    if dry_run:
        return 1, freed
    parent = path.parent
    mode = stat.S_IMODE(os.lstat(parent).st_mode)
    tmp = parent / f".llmgw-optimise-{os.getpid()}"
    os.chmod(parent, mode | stat.S_IWUSR)
    try:
        os.link(pool_entry, tmp)
        os.rename(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.chmod(parent, mode & ~WRITE_BITS)
    return 1, freed
