"""Sharing identical files between store paths when a path is registered, through optimise's pool.

The pool `ROOT/store/.links/<blake3>-<f|x>` holds one link per distinct file content (see
integrity/optimise.py, which fills it for paths registered before this and keeps the same rules).
`share(layout, tree)` runs on a new path's tree once it is complete, frozen and hashed (its
`.llmgw/contents` written), still `.partial` — invisible to every other process — and under its
key's lock. For each regular, non-empty file of the listing:

- the pool has no entry for its digest and kind: the file, if nothing else links it (so never an
  inode a cache or another tree shares), becomes the pool's copy (one more link, no byte moved);
- the pool has an entry: it is opened O_NOFOLLOW|O_NONBLOCK and checked by its descriptor against
  the one rule for sharing an inode (`shareable`: a regular file of the store's owner, exactly the
  canonical frozen mode, no extended attribute — no file capability), the same size, mode, owner
  and group as the new file — then hashed (blake3, mmap and threads for big files) and
  compared with the new file's listed digest. Only then is it linked under a temporary name in the
  new file's directory, the link checked to be that very inode, and renamed over the new file:
  rename(2) is atomic, so the name holds the new bytes or the identical pool bytes, never nothing.
  An entry that is not a plain file of ours or does not hold its name's bytes was planted or
  damaged: it leaves the pool (the paths that link it keep it; `verify` names them) and the new
  file takes its place.

So a new path shares only bytes that were hashed when it was made, and it hashes to the same
listing: every replaced file has the same bytes, size and mode. Nothing here can make the build
fail: a file that cannot be shared (a race with gc or optimise, EMLINK, ENOSPC) stays as it is.
Directories of the frozen tree are made writable by their owner only while their files are swapped.
gc removes pool entries that no store path links any more (link count 1).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw_store.app.units import human_size
from llmgw_store.base.errors import StoreError
from llmgw_store.base.report import say
from llmgw_store.core import manifest

if TYPE_CHECKING:
    from llmgw_store.core.layout import Layout

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_EUID = os.geteuid()
# The mode of every frozen store file (build/canonical.py, then freeze): an inode shared between
# store paths has exactly this, so sharing it changes no path's modes.
CANONICAL_FILE_MODES = {"f": 0o444, "x": 0o555}


@dataclass(frozen=True)
class Shared:
    files: int  # files of the new tree now linked to an identical file of another store path
    bytes_saved: int  # what those files took on disk (st_blocks): freed when they were replaced
    pooled: int  # files of the new tree entered into the pool for later paths


def has_xattrs(fd: int) -> bool:
    """Whether the open file carries any extended attribute (`security.capability` is one: a file
    capability). A filesystem without xattrs has none."""
    try:
        return bool(os.listxattr(fd))
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        raise


def shareable(fd: int, st: os.stat_result, kind: str) -> str | None:
    """THE rule for an inode that another store path may link (registration-time sharing, optimise,
    a delta pull's reuse), checked on the open descriptor `fd` (fstat `st`): why it may not be, or
    None. It must be a regular file owned by the store's owner (uid and gid), with exactly the
    canonical frozen mode of its kind (0444, or 0555 for `x`) and no extended attribute (no file
    capability). The caller also proves its bytes (a digest of what it reads from `fd`) and that it
    is one of the store's own inodes (`store_inode`). Anything else is copied, never linked: a
    link would hand its owner, its mode or its capability to the path that links it."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != _EUID or st.st_gid != os.getegid():
        return f"owned by {st.st_uid}:{st.st_gid}, not by the store's owner"
    want = CANONICAL_FILE_MODES.get(kind)
    if stat.S_IMODE(st.st_mode) != want:
        return f"mode {stat.S_IMODE(st.st_mode):04o}, not {want or 0:04o}"
    if has_xattrs(fd):
        return "it has extended attributes (a file capability?)"
    return None


def store_inode(pool: str | os.PathLike, st: os.stat_result, e: manifest.Entry) -> bool:
    """Whether the inode `st`, found at a file of a store path listed as `e`, is the store's alone:
    it has no other link, or it is the pool's entry for its digest (every link the store makes
    between paths goes through the pool, so a shared inode without that entry may share itself
    with a cache or a file outside the store, as paths made before issue 12 did with uv's cache)."""
    if st.st_nlink == 1:
        return True
    try:
        pst = os.lstat(os.path.join(pool, pool_name(e)))
    except OSError:
        return False
    return (pst.st_dev, pst.st_ino) == (st.st_dev, st.st_ino)


def pool_name(e: manifest.Entry) -> str:
    return f"{e.digest}-{e.kind}"


THREADS = min(8, (os.cpu_count() or 1) * 2)  # link, rename and hashing release the GIL
BATCH = 64  # files per pool task


def share(layout: Layout, tree: Path) -> Shared:
    """Link the files of `tree` (a complete, frozen, hashed tree under its key's lock, not yet
    renamed into place) to identical, verified files already in the pool; enter the others into the
    pool. See the module's docstring for what is checked."""
    try:
        entries = [e for e in manifest.read_contents(tree) if e.kind in "fx" and e.size]
    except (OSError, ValueError):
        return Shared(0, 0, 0)
    if not entries:
        return Shared(0, 0, 0)
    started = time.monotonic()
    try:
        layout.ensure_pool()  # checked like every store directory: never a link, ours, 0755
        return _share_all(layout, tree, entries, started)
    except (OSError, StoreError) as exc:
        say(f"files not shared with other store paths ({exc}); this path keeps its own copies")
        return Shared(0, 0, 0)


def _share_all(layout: Layout, tree: Path, entries: list[manifest.Entry], started: float) -> Shared:
    pool = os.fspath(layout.links_pool)
    root = os.fspath(tree)
    # The directories that hold files, writable by their owner while their files are swapped, then
    # frozen again; the tree is `.partial` and its key locked, so no one else sees them meanwhile.
    # Their times are put back too: a rename in a directory moves its mtime, and a build's
    # directories carry the resolution date (canonical.py) whether or not a file was shared.
    dirs: dict[str, tuple[int, tuple[int, int]]] = {}
    for e in entries:
        d = os.path.dirname(f"{root}/{e.path}")
        if d not in dirs:
            st = os.lstat(d)
            dirs[d] = (stat.S_IMODE(st.st_mode), (st.st_atime_ns, st.st_mtime_ns))
    results: list[tuple[int, int, int]] = []
    proc_fd = open_proc_fd()
    try:
        for d, (mode, _) in dirs.items():
            os.chmod(d, mode | stat.S_IWUSR)
        batches = [entries[i:i + BATCH] for i in range(0, len(entries), BATCH)]
        if len(batches) == 1:
            results = [_share_batch(root, pool, batches[0], proc_fd)]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(THREADS) as workers:
                results = list(workers.map(lambda b: _share_batch(root, pool, b, proc_fd), batches))
    finally:
        for d, (mode, times) in dirs.items():
            os.chmod(d, mode)
            os.utime(d, ns=times, follow_symlinks=False)
        if proc_fd is not None:
            os.close(proc_fd)
    files = sum(r[0] for r in results)
    saved = sum(r[1] for r in results)
    pooled = sum(r[2] for r in results)
    if files or pooled:
        say(f"shared {files} file(s) with other store paths ({human_size(saved)} not stored twice) "
            f"in {time.monotonic() - started:.1f}s")
    return Shared(files, saved, pooled)


def _share_batch(root: str, pool: str, entries: list[manifest.Entry], proc_fd: int | None) -> tuple[int, int, int]:
    files = saved = pooled = 0
    for e in entries:
        try:
            done = _share_one(f"{root}/{e.path}", f"{pool}/{e.digest}-{e.kind}", e, proc_fd)
        except OSError as exc:
            if exc.errno not in (errno.EMLINK, errno.ENOSPC, errno.ENOENT, errno.EEXIST, errno.EDQUOT):
                say(f"could not share {e.path} ({exc.strerror}); it keeps its own copy")
            continue
        if done is None:
            pooled += 1
        elif done:
            files += 1
            saved += done
    return files, saved, pooled


_temp_serial = itertools.count()  # next() on a count is atomic under the GIL: one name per link
_PID = os.getpid()


def _pool_new(path: str, entry: str, e: manifest.Entry) -> None:
    """Make the new file `path` (hashed into its listing by this build, under its key's lock) the
    pool's copy, if the sharing rule holds for it (EEXIST: another process pooled one first)."""
    fd = os.open(path, _OPEN)
    try:
        if shareable(fd, os.fstat(fd), e.kind) is None:
            os.link(path, entry)
    finally:
        os.close(fd)


def _share_one(path: str, entry: str, e: manifest.Entry, proc_fd: int | None) -> int | None:
    """Bytes freed (st_blocks) once `path` is a link to the pool's identical copy; None if `path`
    became the pool's copy; 0 if nothing was done."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size != e.size or st.st_nlink != 1:
        return 0  # not as listed, or linked from elsewhere: neither shared nor pooled
    try:
        fd = os.open(entry, _OPEN)
    except FileNotFoundError:
        _pool_new(path, entry, e)
        return None
    except OSError:
        drop(entry, None)  # a link or a FIFO planted under a pool name
        _pool_new(path, entry, e)
        return None
    try:
        pst = os.fstat(fd)
        if (pst.st_dev, pst.st_ino) == (st.st_dev, st.st_ino):
            return 0
        if shareable(fd, pst, e.kind) is not None or pst.st_size != e.size:
            drop(entry, pst)  # planted, or gained a capability or a mode since: it leaves the pool
            _pool_new(path, entry, e)
            return None
        if (stat.S_IMODE(pst.st_mode), pst.st_uid, pst.st_gid) != (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid):
            return 0  # same bytes, another mode or owner: an inode has one of each, so not shared
        if manifest.digest_fd(fd, pst) != e.digest:
            drop(entry, pst)  # damaged since it was pooled: never linked into a new path
            _pool_new(path, entry, e)
            return None
        tmp = f"{os.path.dirname(path)}/.llmgw-share-{_PID}-{next(_temp_serial)}"
        link_checked(fd, pst, entry, tmp, proc_fd)
        try:
            # Atomic: `path` names the new file or the identical, checked pool inode.
            os.rename(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return st.st_blocks * 512
    finally:
        os.close(fd)


def link_checked(fd: int, pst: os.stat_result, entry: str, tmp: str, proc_fd: int | None) -> None:
    """Link, at `tmp`, the very inode open as `fd` (the one just hashed): through /proc/self/fd
    (`proc_fd`, linkat with AT_SYMLINK_FOLLOW), which names the open file, not whatever the pool
    name holds now; where /proc is missing, by the pool name, then checked to be that inode."""
    if proc_fd is not None:
        os.link(str(fd), tmp, src_dir_fd=proc_fd, follow_symlinks=True)
        return
    os.link(entry, tmp)
    lst = os.lstat(tmp)
    if (lst.st_dev, lst.st_ino) != (pst.st_dev, pst.st_ino):
        os.unlink(tmp)
        raise OSError(errno.ESTALE, "the pool entry was replaced while it was checked", entry)


def open_proc_fd() -> int | None:
    """/proc/self/fd, for `link_checked` (None where /proc is missing)."""
    try:
        return os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def drop(entry: str | os.PathLike, checked: os.stat_result | None) -> None:
    """Take a bad entry out of the pool, if the name still holds what was checked (`checked`, or
    for None anything that is not a regular file)."""
    try:
        now = os.lstat(entry)
    except FileNotFoundError:
        return
    if checked is None:
        if stat.S_ISREG(now.st_mode):
            return
    elif (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
        return
    os.unlink(entry)
