"""`optimise`: hardlink identical files across store paths, as Nix's optimise-store does.

Every regular file of a registered path is linked from a content-addressed pool
`ROOT/store/.links/<blake3>-<f|x>` (the exec bit is part of an inode, so it is part of the name).
A file whose content is already in the pool under another inode is replaced by a link to the pool
entry: a new link is made beside it and renamed over it (atomic: the file is never missing). Its
directory is made writable for that moment and frozen again. Files stay read-only throughout.

Digests come from each path's `.llmgw/contents`, and every file is proved against them: optimise
links a file only after its bytes, read from the descriptor it is opened on (O_NOFOLLOW), hash to
the digest its listing records. One that does not is damaged — modified in place, truncated to the
same size — and is left exactly as it is, reported (`damaged`, exit 1, as `verify` reports it),
for `verify --repair`: replacing it by the pool's good copy would hide the tampering and destroy
the evidence. What the pool links are the store's own inodes only, and only bytes that were
checked, under the one sharing rule of core/dedupe.py (`shareable`: a plain file of the store's
owner, exactly the canonical mode, no extended attribute such as a file capability; `store_inode`:
no link outside the store); a file that fails it is neither linked nor pooled (`verify` names its
mode, owner or xattrs). A pool entry is linked into another path only once it has been hashed in
this run and found to hold what its name says, through its descriptor (`dedupe.link_checked`:
linkat of /proc/self/fd/N, so what is linked is the inode that was hashed, not whatever the name
holds by then); an entry that fails the rule or its digest leaves the pool. What sharing does
cost: paths linked to one pool entry are one inode, so an edit in place to one of them changes all
of them (`verify` names each; `verify --repair` rebuilds each as a separate tree). gc removes pool
entries that no store path links any more.

Builds share nothing with uv's own cache (installed files are copies, or links from the wheel home);
the bytecode cache's entries become links to a registered path's pycs (build/bytecode.link_cache). A
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

from llmgw_store.app.results import Result
from llmgw_store.app.units import human_size
from llmgw_store.base.report import say
from llmgw_store.core import manifest
from llmgw_store.core.dedupe import drop, link_checked, open_proc_fd, pool_name, shareable, store_inode
from llmgw_store.core.local_store import Store
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.temproots import gc_lock
from llmgw_store.system.trees import WRITE_BITS

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class OptimiseReport(Result):
    """`damaged`: files (`<store path name>/<file>`) whose bytes do not hash to their listing's
    digest, left as they are for `verify --repair`; `not_shareable`: files the sharing rule refused
    (another owner, mode or xattrs: `verify` names them), neither linked nor pooled."""

    files_examined: int
    files_linked: int
    bytes_saved: int
    dry_run: bool
    damaged: tuple[str, ...] = ()
    not_shareable: int = 0


def optimise(*, root: str | Path | None = None, dry_run: bool = False,
             lock_timeout: float = LOCK_TIMEOUT_S) -> OptimiseReport:
    with Store.open(root, lock_timeout) as store:
        # Made or checked like every store directory (Layout.dir_modes): ours, 0755, never a link.
        if not dry_run:
            store.layout.ensure_pool()
        pool = store.layout.links_pool
        run = _Run(dry_run, pool)
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
                    if done < 0:
                        run.damaged.append(f"{row.name}/{manifest.shown_path(e.path)}")
                        say(f"{row.name}: {manifest.shown_path(e.path)} does not hash to its listed digest "
                            "(modified in place): left as it is; run `llmgw-store verify --repair`")
                        continue
                    n_linked += done
                    n_saved += freed
                if n_linked:
                    say(f"{row.name}: {n_linked} file(s) {'would be ' if dry_run else ''}linked, "
                             f"{human_size(n_saved)} {'would be ' if dry_run else ''}freed")
                linked += n_linked
                saved += n_saved
        if run.proc_fd is not None:
            os.close(run.proc_fd)
        return OptimiseReport(examined, linked, saved, dry_run, tuple(run.damaged), run.not_shareable)


class _Run:
    """What one run has learnt: the inodes hashed (and what they hash to), and for --dry-run the
    pool as it would be (entries it would add) and the links it would have removed, so that the
    figures of a dry run are the ones the real run gives."""

    def __init__(self, dry_run: bool, pool: Path) -> None:
        self.dry_run, self.pool = dry_run, pool
        self.digests: dict[tuple[int, int, int, int], str] = {}  # (dev, ino, size, ctime) -> blake3
        self.would_pool: dict[str, tuple[int, int]] = {}  # pool name -> inode it would hold
        self.would_unlink: dict[tuple[int, int], int] = {}  # inode -> names it would no longer have
        self.damaged: list[str] = []
        self.not_shareable = 0
        self.proc_fd = None if dry_run else open_proc_fd()

    def links_left(self, st: os.stat_result) -> int:
        """Links `st`'s inode has (would have, in a dry run) before one more name is replaced."""
        return st.st_nlink - self.would_unlink.get((st.st_dev, st.st_ino), 0)

    def digest(self, fd: int, st: os.stat_result) -> str:
        """blake3 of the open file, once per inode per run (an inode of many paths is read once)."""
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)
        d = self.digests.get(ident)
        if d is None:
            d = self.digests[ident] = manifest.digest_fd(fd, st)
        return d


def _share(path: Path, pool_entry: Path, e: manifest.Entry, run: _Run) -> tuple[int, int]:
    """(1 if `path` was (or would be) replaced by a link to the pool entry, bytes on disk that
    freed: the inode's blocks, once its last link is gone); (-1, 0) if `path` is damaged (its bytes
    are not its listing's digest): left as it is."""
    try:
        fd = os.open(path, _OPEN)
    except OSError:
        return 0, 0  # gone, or swapped for a link or a FIFO: verify names it
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != e.size:
            return 0, 0  # verify names it
        if run.digest(fd, st) != e.digest:
            return -1, 0  # tampered with: the evidence stays, for verify --repair
        if shareable(fd, st, e.kind) is not None or not store_inode(run.pool, st, e):
            run.not_shareable += 1
            return 0, 0
        ident = (st.st_dev, st.st_ino)
        pfd, pst = _checked_entry(pool_entry, e, run)
        try:
            if pst is None:
                # No good entry: this inode, proved above and linked nowhere else, becomes the
                # pool's copy (never a cache's inode, never a tampered file).
                if st.st_nlink == 1:
                    if run.dry_run:
                        run.would_pool[pool_entry.name] = ident
                    else:
                        try:  # the inode hashed above, by its descriptor (not whatever `path` names now)
                            link_checked(fd, st, os.fspath(path), os.fspath(pool_entry), run.proc_fd)
                        except FileExistsError:  # a build pooled its own copy meanwhile: next run
                            pass
                return 0, 0
            if (pst.st_dev, pst.st_ino) == ident:
                return 0, 0
            freed = st.st_blocks * 512 if run.links_left(st) == 1 else 0  # another link keeps it alive
            if run.dry_run:
                run.would_unlink[ident] = run.would_unlink.get(ident, 0) + 1
                return 1, freed
            assert pfd is not None, "only a dry run's pool entries are virtual (no descriptor)"
            _replace(path, pfd, pst, pool_entry, run)
            return 1, freed
        finally:
            if pfd is not None:
                os.close(pfd)
    finally:
        os.close(fd)


def _replace(path: Path, pfd: int, pst: os.stat_result, pool_entry: Path, run: _Run) -> None:
    """Replace `path` by a link to the pool inode open as `pfd` (hashed and checked this run)."""
    parent = path.parent
    mode = stat.S_IMODE(os.lstat(parent).st_mode)
    tmp = parent / f".llmgw-optimise-{os.getpid()}"
    os.chmod(parent, mode | stat.S_IWUSR)
    try:
        link_checked(pfd, pst, os.fspath(pool_entry), os.fspath(tmp), run.proc_fd)
        os.rename(tmp, path)  # atomic: the name holds the old inode or the identical pool one
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.chmod(parent, mode & ~WRITE_BITS)


def _checked_entry(pool_entry: Path, e: manifest.Entry, run: _Run) -> tuple[int | None, os.stat_result | None]:
    """(fd, fstat) of the pool entry if it holds the bytes its name says under the sharing rule
    (hashed once per run per inode), else (None, None); an entry that fails leaves the pool."""
    virtual = run.would_pool.get(pool_entry.name)
    if virtual is not None:  # a dry run's entry: that file, already hashed
        return None, _Virtual(*virtual)  # type: ignore[return-value]
    try:
        pfd = os.open(pool_entry, _OPEN)
    except FileNotFoundError:
        return None, None
    except OSError:
        if not run.dry_run:
            drop(pool_entry, None)  # a link or a FIFO planted under a pool name
        return None, None
    pst = os.fstat(pfd)
    if shareable(pfd, pst, e.kind) is None and pst.st_size == e.size and run.digest(pfd, pst) == e.digest:
        return pfd, pst
    os.close(pfd)
    if not run.dry_run:
        drop(pool_entry, pst)  # the paths that link it keep it; verify names them
    return None, None


class _Virtual:
    """The identity of the file a dry run would have put in the pool."""

    def __init__(self, dev: int, ino: int) -> None:
        self.st_dev, self.st_ino = dev, ino
