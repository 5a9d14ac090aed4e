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

Builds share nothing with the uv or bytecode caches (installed and compiled files are copies). A
build shares its files with the pool when it registers its path (core/dedupe.py, the same rules),
so what optimise recovers is what paths registered before that, or pulled from a binary cache, hold
twice: the files of common wheels, compiled bytecode (path-independent, see bytecode.py), the
venv's scripts, dist-info files. Bytes saved are counted honestly: an inode's blocks (st_blocks),
once its last link is replaced; a dry run keeps the pool and the link counts it would have made.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core import manifest
from llmgw_store.core.dedupe import plain_ours, pool_name
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
        run = _Run(dry_run)
        linked = saved = examined = 0
        # Shared gc lock: gc (exclusive) cannot prune the pool or delete a path under us; builds and
        # activations (also shared) go on.
        with gc_lock(store.layout, shared=True, timeout=lock_timeout, what="optimising"):
            for row in store.index.paths():
                env = store.layout.path_of(row.name)
                try:
                    entries = manifest.read_contents(env)
                except (OSError, ValueError) as exc:
                    say(f"{row.name}: skipped, its contents listing cannot be read ({exc}); run `llmgw-store verify`")
                    continue
                n_linked, n_saved = 0, 0
                for e in entries:
                    if e.kind not in "fx" or e.size == 0:
                        continue
                    examined += 1
                    done, freed = _share(env / e.path, pool / pool_name(e), e, run)
                    n_linked += done
                    n_saved += freed
                if n_linked:
                    say(f"{row.name}: {n_linked} file(s) {'would be ' if dry_run else ''}linked, "
                             f"{human_size(n_saved)} {'would be ' if dry_run else ''}freed")
                linked += n_linked
                saved += n_saved
        return OptimiseReport(examined, linked, saved, dry_run)


class _Run:
    """What one run has learnt: the pool inodes hashed and found right, and for --dry-run the pool
    as it would be (entries it would add) and the links it would have removed, so that the figures
    of a dry run are the ones the real run gives."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.checked: set[tuple[int, int]] = set()
        self.would_pool: dict[str, tuple[int, int]] = {}  # pool name -> inode it would hold
        self.would_unlink: dict[tuple[int, int], int] = {}  # inode -> names it would no longer have

    def links_left(self, st: os.stat_result) -> int:
        """Links `st`'s inode has (would have, in a dry run) before one more name is replaced."""
        return st.st_nlink - self.would_unlink.get((st.st_dev, st.st_ino), 0)


def _share(path: Path, pool_entry: Path, e: manifest.Entry, run: _Run) -> tuple[int, int]:
    """(1 if `path` was (or would be) replaced by a link to the pool entry, bytes on disk that
    freed: the inode's blocks, once its last link is gone)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0, 0
    if not stat.S_ISREG(st.st_mode) or st.st_size != e.size:
        return 0, 0
    ident = (st.st_dev, st.st_ino)
    pst = _checked_entry(pool_entry, e, run)
    if pst is None:
        # This inode becomes the pool's copy only if nothing else links it and it holds the
        # listed bytes: the pool never takes a cache's inode, nor a tampered file.
        if st.st_nlink == 1 and _digest_of(path) == e.digest:
            if run.dry_run:
                run.would_pool[pool_entry.name] = ident
            else:
                try:
                    os.link(path, pool_entry)
                except FileExistsError:  # a build pooled its own copy meanwhile: next run
                    return 0, 0
            run.checked.add(ident)
        return 0, 0
    if (pst.st_dev, pst.st_ino) == ident:
        return 0, 0
    freed = st.st_blocks * 512 if run.links_left(st) == 1 else 0  # another link keeps it alive
    if run.dry_run:
        run.would_unlink[ident] = run.would_unlink.get(ident, 0) + 1
        return 1, freed
    parent = path.parent
    mode = stat.S_IMODE(os.lstat(parent).st_mode)
    tmp = parent / f".llmgw-optimise-{os.getpid()}"
    os.chmod(parent, mode | stat.S_IWUSR)
    try:
        os.link(pool_entry, tmp)
        os.rename(tmp, path)  # atomic: the name holds the old inode or the identical pool one
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.chmod(parent, mode & ~WRITE_BITS)
    return 1, freed


def _checked_entry(pool_entry: Path, e: manifest.Entry, run: _Run) -> os.stat_result | None:
    """The pool entry's lstat if it holds the bytes its name says (hashed once per run per inode),
    else None; an entry that is not a regular file of the right size and digest leaves the pool."""
    virtual = run.would_pool.get(pool_entry.name)
    if virtual is not None:  # a dry run's entry: that file, already hashed
        return _Virtual(*virtual)  # type: ignore[return-value]
    try:
        pst = os.lstat(pool_entry)
    except FileNotFoundError:
        return None
    ident = (pst.st_dev, pst.st_ino)
    if ident in run.checked:
        return pst
    if plain_ours(pst) and pst.st_size == e.size and _digest_of(pool_entry) == e.digest:
        run.checked.add(ident)
        return pst
    if not run.dry_run:
        os.unlink(pool_entry)  # the paths that link it keep it; verify names them
    return None


class _Virtual:
    """The identity of the file a dry run would have put in the pool."""

    def __init__(self, dev: int, ino: int) -> None:
        self.st_dev, self.st_ino = dev, ino


def _digest_of(path: Path) -> str | None:
    """blake3 of a regular file, never through a symlink; None if it is not one."""
    try:
        return manifest.file_digest(path)
    except OSError:
        return None
