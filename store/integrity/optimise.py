"""`optimise`: hardlink identical files across store paths, as Nix's optimise-store does.

Every regular file of a registered path is linked from a content-addressed pool
`ROOT/store/.links/<blake3>-<f|x>` (the exec bit is part of an inode, so it is part of the name).
A file whose content is already in the pool under another inode is replaced by a link to the pool
entry: a new link is made beside it and renamed over it (atomic: the file is never missing). Its
directory is made writable for that moment and frozen again. Files stay read-only throughout.

Digests come from each path's `.llmgw/contents`; a file whose size differs from its listing is
left alone (`verify` reports it). What the pool links are store files only, and only bytes that
were checked: a file becomes the pool's copy only if it has no other link (not a cache's, not
another path's) and hashes to its listed digest; a pool entry is linked into another path only
once it has been hashed in this run and found to hold what its name says, and only if it is a
plain file of the store's user with no write, setuid, setgid or sticky bit (one that is not, or
does not hold its bytes, is dropped from the pool: it was planted). So an edit to one path's file never spreads to a path that did not
already share it. What sharing does cost: paths linked to one pool entry are one inode, so an
edit in place to one of them changes all of them (`verify` names each; `verify --repair`
rebuilds each as a separate tree). gc removes pool entries that no store path links any more.

Builds share nothing with the uv or bytecode caches (installed and compiled files are copies), so
what optimise recovers is every identical file across paths: the files of common wheels, compiled
bytecode (path-independent, see bytecode.py), the venv's scripts, dist-info files.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core import manifest
from llmgw_store.core.fsutil import WRITE_BITS
from llmgw_store.core.local_store import Store
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.report import say
from llmgw_store.core.results import Result
from llmgw_store.core.temproots import gc_lock
from llmgw_store.core.units import human_size


@dataclass(frozen=True)
class OptimiseReport(Result):
    files_examined: int
    files_linked: int
    bytes_saved: int
    dry_run: bool


def optimise(*, root: str | Path | None = None, dry_run: bool = False,
             lock_timeout: float = LOCK_TIMEOUT_S) -> OptimiseReport:
    with Store.open(root, lock_timeout) as store:
        # Made or checked like every store directory (Layout.dir_modes): ours, 0755, never a link.
        if not dry_run:
            store.layout.ensure_pool()
        pool = store.layout.links_pool
        linked = saved = examined = 0
        checked: set[tuple[int, int]] = set()  # pool inodes hashed and found right in this run
        # Shared gc lock: gc (exclusive) cannot prune the pool or delete a path under us; builds and
        # activations (also shared) go on.
        with gc_lock(store.layout, shared=True, timeout=lock_timeout, what="optimising"):
            for row in store.index.paths():
                env = store.layout.path_of(row["name"])
                try:
                    entries = manifest.read_contents(env)
                except (OSError, ValueError) as exc:
                    say(f"{row['name']}: skipped, its contents listing cannot be read ({exc}); run `llmgw-store verify`")
                    continue
                n_linked, n_saved = 0, 0
                for e in entries:
                    if e.kind not in "fx" or e.size == 0:
                        continue
                    examined += 1
                    done, freed = _share(env / e.path, pool / f"{e.digest}-{e.kind}", e, checked, dry_run)
                    n_linked += done
                    n_saved += freed
                if n_linked:
                    say(f"{row['name']}: {n_linked} file(s) {'would be ' if dry_run else ''}linked, "
                             f"{human_size(n_saved)} {'would be ' if dry_run else ''}freed")
                linked += n_linked
                saved += n_saved
        return OptimiseReport(examined, linked, saved, dry_run)


def _share(path: Path, pool_entry: Path, e: manifest.Entry, checked: set[tuple[int, int]],
           dry_run: bool) -> tuple[int, int]:
    """(1 if `path` was (or would be) replaced by a link to the pool entry, bytes that freed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0, 0
    if not stat.S_ISREG(st.st_mode) or st.st_size != e.size:
        return 0, 0
    pst = _checked_entry(pool_entry, e, checked, dry_run)
    if pst is None:
        # This inode becomes the pool's copy only if nothing else links it and it holds the
        # listed bytes: the pool never takes a cache's inode, nor a tampered file.
        if not dry_run and st.st_nlink == 1 and _digest_of(path) == e.digest:
            os.link(path, pool_entry)
            checked.add((st.st_dev, st.st_ino))
        return 0, 0
    if pst.st_ino == st.st_ino and pst.st_dev == st.st_dev:
        return 0, 0
    freed = e.size if st.st_nlink == 1 else 0  # another link (another path) keeps it alive
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


def _checked_entry(pool_entry: Path, e: manifest.Entry, checked: set[tuple[int, int]],
                   dry_run: bool) -> os.stat_result | None:
    """The pool entry's lstat if it holds the bytes its name says (hashed once per run per inode),
    else None; an entry that is not a regular file of the right size and digest leaves the pool."""
    try:
        pst = os.lstat(pool_entry)
    except FileNotFoundError:
        return None
    ident = (pst.st_dev, pst.st_ino)
    if ident in checked:
        return pst
    if _plain_ours(pst) and pst.st_size == e.size and _digest_of(pool_entry) == e.digest:
        checked.add(ident)
        return pst
    if not dry_run:
        os.unlink(pool_entry)  # the paths that link it keep it; verify names them
    return None


def _plain_ours(st: os.stat_result) -> bool:
    """Whether a pool entry may be linked into store paths: a regular file of the store's user with
    no write, setuid, setgid or sticky bit (as every frozen store file is). Anything else was
    planted, and sharing its inode would hand its owner or its mode to every path that links it."""
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (WRITE_BITS | stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX))


def _digest_of(path: Path) -> str | None:
    """blake3 of a regular file, never through a symlink; None if it is not one."""
    try:
        return manifest.file_digest(path)
    except OSError:
        return None
