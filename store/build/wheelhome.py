"""The wheel home: the store's immutable home for unpacked wheels, which environments hard-link.

    ROOT/store/.wheels/<id>/     one unpacked wheel, sealed: the store user's, canonical modes
                                 (directories 0555, files 0444 or 0555), mtime 1, never written again
    ROOT/var/wheels/<id>         its seal: the listing (kind, size, blake3 of each entry) it was
                                 checked to hold, written once the check passed
    ROOT/cache/uv/archive-v0 -> ../../store/.wheels    uv's archive bucket is the wheel home

uv unpacks every wheel once into its archive bucket, `archive-v0/<id>/` (unpacked in a temporary
directory of its private cache, then renamed into place), and installs by hard-linking from there
(`--link-mode hardlink`, its default on Linux). In the store's cache that bucket is the wheel home,
so a build goes:

1. uv resolves and installs as it always did, checking every wheel against the lock's sha256
   (`--require-hashes`) before it unpacks it, and links the files into the `.partial`.
2. `adopt` finds the entries the tree links (by the inode of each installed dist-info's METADATA)
   and checks each. One not sealed yet is sealed: every entry a plain file or directory of the
   store's user without extended attributes; every file listed in the wheel's RECORD with its
   digest (sha256 or stronger) and size, none listed and missing, none present and unlisted; then
   canonical modes and time, and the seal (its blake3 listing, computed in the same read as the
   RECORD digests). A sealed entry is checked against its seal without reading a byte: the same
   names, kinds and sizes, the store's user, the canonical modes. Every file of the tree with a
   link outside it must be a file of a checked entry; anything else fails the build.
3. At registration the tree is hashed as every tree is (realise: once — the digests of entries
   sealed in this build are handed over as the scan's memo); every file linked from the wheel home
   must hash to the digest its seal records (`Handoff.check`). One that does not was edited in
   place, through one of its names (a store path's or the wheel home's): its entry is evicted —
   renamed out of the wheel home, so uv fetches and unpacks the wheel again — and the build fails
   with DamagedWheel, which `build` retries once. An edit to one environment's file never reaches
   another environment; `verify` names every path that links the damaged inode.

Invariants:
- A store file shares an inode only with store files: the wheel home's, other store paths', and
  optimise's pool. uv creates an entry (a new directory renamed into place) and never writes one
  again: it hard-links or copies from it, and deletes entries only in `uv cache prune`/`clean`,
  which the store never runs on this cache (gc prunes the wheel home itself).
- Nothing is registered that links an unsealed entry, or a sealed one whose bytes changed.
- gc removes an entry and its seal once none of its files has another link (no store path and no
  build in flight links it), holding uv's cache lock exclusively: no uv process is linking from it.
- Whatever is read here (the bucket link, entries, RECORD, seals) is untrusted until checked:
  nothing is followed through a symlink, names are matched with re.fullmatch, reads are bounded.
"""

from __future__ import annotations

import base64
import csv
import errno
import hashlib
import io
import mmap
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmgw_store.base.errors import IntegrityError, LockTimeout, StoreError
from llmgw_store.base.report import progress, say
from llmgw_store.build.cacheuse import ARCHIVE_BUCKET, ARCHIVE_RE, DIST_INFO_RE, WHEEL_HOME_LINK, uv_cache_lock
from llmgw_store.core import manifest
from llmgw_store.system import files
from llmgw_store.system.trees import TreeTooLarge, force_rmtree, walk

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from llmgw_store.core.layout import Layout

WHEEL_MTIME = 1  # every entry's time, as Nix gives store files: nothing of when or by whom it was made
DIR_MODE, FILE_MODE, EXEC_MODE = 0o555, 0o444, 0o555
MAX_ENTRIES = 1 << 20  # files and directories of one wheel
MAX_DEPTH = 64
RECORD_MAX = 64 << 20
SEAL_MAX = 512 << 20  # the bound manifest.CONTENTS_MAX puts on a listing
# Digests a RECORD may give (PEP 427: sha256 or stronger).
RECORD_ALGOS = {"sha256", "sha384", "sha512", "sha3_256", "sha3_384", "sha3_512", "blake2b", "blake2s"}
UNHASHED = ("RECORD", "RECORD.jws", "RECORD.p7s")  # a dist-info's files its RECORD lists without a digest
THREADS = min(8, (os.cpu_count() or 1) * 2)
BATCH_FILES, BATCH_BYTES = 64, 4 << 20
ATTACH_LOCK_S = 10.0  # how long a build waits for uv's cache lock to make the bucket the wheel home
EVICT_LOCK_S = 10.0
_EUID = os.geteuid()
# (path in the wheel, the digest its RECORD gives) -> the digest uv's unpacking gave, for files whose
# RECORD line is wrong as published (pynvvideocodec 2.0.4 ships two such .so files: its wheel's
# sha256 is the lock's, its RECORD is not its contents). The first mismatch evicts the entry and
# the build runs again (uv unpacks the hash-checked wheel anew); the same bytes the second time are
# the wheel's own, and sealed as unpacked. In this process only: a new process checks afresh.
_RECORD_WRONG: dict[tuple[str, str], str] = {}
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DamagedWheel(IntegrityError):
    """A wheel home entry did not hold what its wheel's RECORD or its seal says; it was evicted
    (the next build unpacks the wheel again), and the build that met it failed."""


# --- uv's archive bucket is the wheel home ---------------------------------------------------------

def attach(layout: Layout) -> bool:
    """Make `cache/uv/archive-v0` the store's link to the wheel home (moving what an older store's
    bucket holds into the wheel home, unsealed), under uv's cache lock. True once it is; False when
    uv kept its lock past ATTACH_LOCK_S (the build then installs by copy, as before the wheel home)."""
    layout.ensure_pool(wheels=True)  # checked like every store directory: ours, 0755, never a link
    link = layout.uv_cache / ARCHIVE_BUCKET
    if _attached(link):
        return True
    try:
        with uv_cache_lock(layout.uv_cache, ATTACH_LOCK_S):
            # No uv process runs from here on: the bucket can change under none.
            if not _attached(link):
                _move_bucket(layout, link)
                tmp = link.with_name(f".{ARCHIVE_BUCKET}-{os.getpid()}")
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                os.symlink(WHEEL_HOME_LINK, tmp)
                os.rename(tmp, link)  # atomic: uv sees no bucket or the link, never half of one
    except (LockTimeout, OSError) as exc:
        say(f"installing by copy this time: uv's archive bucket could not be made the wheel home ({exc})")
        return False
    return True


def _attached(link: Path) -> bool:
    try:
        return os.readlink(link) == WHEEL_HOME_LINK
    except OSError:
        return False


def _move_bucket(layout: Layout, link: Path) -> None:
    """Take what is at `cache/uv/archive-v0` out of uv's way: a real bucket's well-named entries
    move into the wheel home (unsealed: a build seals what it links, gc prunes what none links),
    anything else goes to the trash. Called with uv's cache lock held."""
    try:
        st = os.lstat(link)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        moved = 0
        with os.scandir(link) as it:
            for i, e in enumerate(it):
                if i >= MAX_ENTRIES:
                    break
                if ARCHIVE_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False) \
                        and not os.path.lexists(layout.wheel_home / e.name):
                    os.rename(e.path, layout.wheel_home / e.name)
                    moved += 1
        if moved:
            say(f"moved {moved} unpacked wheel(s) from uv's cache into the wheel home {layout.wheel_home}")
        aside = layout.trash / f"uv-{ARCHIVE_BUCKET}.{os.getpid()}.{time.monotonic_ns()}"
        os.rename(link, aside)
        force_rmtree(aside)
    else:
        os.unlink(link)  # a link to elsewhere, or a file: never followed


# --- adopting what a build linked -----------------------------------------------------------------

@dataclass
class Handoff:
    """What `adopt` learnt of a tree, for its registration (realise pops it from make's result):
    `memo` is manifest.scan's memo for the inodes sealed in this build (hashed once), `expected`
    the digest each file linked from the wheel home must have, `inodes` those files' inodes
    (canonical.normalise leaves them alone: they are canonical already, and shared)."""

    layout: Layout
    tree: Path | None = None
    expected: dict[str, tuple[str, str, tuple[int, int]]] = field(default_factory=dict)  # path -> (entry id, blake3, inode)
    memo: dict = field(default_factory=dict)
    inodes: set[tuple[int, int]] = field(default_factory=set)
    entries: dict[str, str] = field(default_factory=dict)  # entry id -> the wheel's dist-info name

    def check(self, listing: list[manifest.Entry]) -> None:
        """Every file linked from the wheel home hashed (in the tree's scan) to what its entry's seal
        records; else its entries are evicted and DamagedWheel raised."""
        bad: dict[str, list[str]] = {}
        for e in listing:
            want = self.expected.get(e.path)
            if want is not None and e.digest != want[1] and self._still_linked(e.path, want[2]):
                bad.setdefault(want[0], []).append(e.path)
        if bad:
            evict(self.layout, bad)
            first = next(iter(bad))
            raise DamagedWheel(
                f"the wheel home's copy of {self.entries.get(first, first)} changed since it was sealed "
                f"({bad[first][0]}: edited in place through some store path): it was removed from the wheel "
                "home, the wheel is unpacked again on the next build, and `llmgw-store verify` names the "
                "store paths that link the damaged file")


    def _still_linked(self, path: str, ino: tuple[int, int]) -> bool:
        """Whether `path` is still the wheel home's inode: a later step of the build may have put a
        file of its own at that name (a wheel that ships a .pyc the bytecode step compiles again,
        renaming a new file over it), which is no edit of the wheel home."""
        if self.tree is None:
            return True
        try:
            st = os.lstat(os.path.join(self.tree, path))
        except OSError:
            return True
        return (st.st_dev, st.st_ino) == ino


def adopt(layout: Layout, tree: Path) -> Handoff:
    """Seal or check every wheel home entry `tree` (a `.partial` under its key's lock, uv done)
    links, and map the tree's linked files to their entries (see the module's docstring)."""
    started = time.monotonic()
    handoff = Handoff(layout, tree)
    wanted = _linked_dist_infos(tree)
    if not wanted:
        return handoff
    found = _entries_holding(layout.wheel_home, wanted)
    inode_map: dict[tuple[int, int], tuple[str, str, str]] = {}  # inode -> (entry id, path in it, blake3)
    problems: dict[str, str] = {}
    sealed = 0
    for ident, dist in sorted(found.items()):
        handoff.entries[ident] = dist.removesuffix(".dist-info")
        try:
            seal = _read_seal(layout, ident)
            if seal is None:
                listing, inodes = _seal(layout, ident, handoff.memo)
                sealed += 1
            else:
                listing, inodes = _check_sealed(layout.wheel_home / ident, seal)
        except _Damage as exc:
            problems[ident] = str(exc)
            continue
        for rel, ino in inodes.items():
            inode_map[ino] = (ident, rel, listing[rel])
    if problems:
        evict(layout, {i: [] for i in problems})
        ident, why = next(iter(problems.items()))
        raise DamagedWheel(f"the wheel home's {handoff.entries[ident]} is not what its wheel's RECORD lists "
                           f"({why}): it was removed, and the wheel is unpacked again on the next build")
    _map_tree(tree, inode_map, handoff)
    say(f"linked {len(handoff.expected)} file(s) from {len(found)} wheel(s) of the wheel home"
        + (f" ({sealed} sealed now)" if sealed else "") + f" in {time.monotonic() - started:.1f}s")
    return handoff


def _linked_dist_infos(tree: Path) -> dict[str, tuple[int, int]]:
    """dist-info name -> the inode of its METADATA, for each installed distribution whose METADATA
    has another link (uv linked it from an archive)."""
    out: dict[str, tuple[int, int]] = {}
    lib = tree / "lib"
    for py in os.scandir(lib) if lib.is_dir() else []:
        site = Path(py.path) / "site-packages"
        if not py.is_dir(follow_symlinks=False) or site.is_symlink() or not site.is_dir():
            continue
        for e in os.scandir(site):
            if DIST_INFO_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
                try:
                    st = os.lstat(os.path.join(e.path, "METADATA"))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    out[e.name] = (st.st_dev, st.st_ino)
    return out


def _entries_holding(home: Path, wanted: dict[str, tuple[int, int]]) -> dict[str, str]:
    """entry id -> dist-info name, for the entries of the wheel home whose METADATA is one `wanted` names."""
    found: dict[str, str] = {}
    try:
        it = os.scandir(home)
    except FileNotFoundError:
        return found
    with it:
        for i, e in enumerate(it):
            if i >= MAX_ENTRIES or len(found) == len(wanted):
                break
            if not (ARCHIVE_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False)):
                continue
            try:
                names = [n for n in os.listdir(e.path) if n in wanted]
            except OSError:
                continue
            for n in names:
                try:
                    st = os.lstat(os.path.join(e.path, n, "METADATA"))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == wanted[n]:
                    found[e.name] = n
    return found


def _map_tree(tree: Path, inode_map: dict[tuple[int, int], tuple[str, str, str]], handoff: Handoff) -> None:
    """Fill `handoff.expected` and `.inodes` from the tree's files with other links. A file whose
    inode has links outside the tree and is no checked entry's is refused: it shares its inode with
    something the store does not own."""
    others: dict[tuple[int, int], list[str]] = {}
    nlinks: dict[tuple[int, int], int] = {}
    for rel, st in walk(tree, sort=False, strict=True):
        if rel and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            ino = (st.st_dev, st.st_ino)
            hit = inode_map.get(ino)
            if hit is not None:
                handoff.expected[rel] = (hit[0], hit[2], ino)
                handoff.inodes.add(ino)
            else:
                others.setdefault(ino, []).append(rel)
                nlinks[ino] = st.st_nlink
    for ino, names in others.items():
        if len(names) != nlinks[ino]:  # all its links inside the tree: a source archive's own hardlink
            raise StoreError(f"{tree.name}/{names[0]} shares its inode with a file outside the environment that "
                             "is not in the wheel home; refusing to register it (run the build again)")


# --- sealing an entry, checking a sealed one ---------------------------------------------------------

class _Damage(Exception):
    """Why an entry cannot be sealed or no longer matches its seal."""


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """(path, lstat) of every entry under `root` (itself as ""), depth first over sorted names: the
    order of a listing. Raises _Damage for anything but plain files and directories of the store's
    user, and past MAX_ENTRIES or MAX_DEPTH; OSError for an entry gone or replaced meanwhile."""
    out: list[tuple[str, os.stat_result]] = []
    try:
        for rel, st in walk(root, max_depth=MAX_DEPTH, max_entries=MAX_ENTRIES, strict=True):
            if not rel:
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != _EUID:
                    raise _Damage("it is not a directory of the store's user")
            elif st.st_uid != _EUID:
                raise _Damage(f"{rel} is owned by uid {st.st_uid}, not by the store's user")
            elif not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
                raise _Damage(f"{rel} is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a plain file'}")
            out.append((rel, st))
    except FileNotFoundError:
        if not out:
            raise _Damage("it is gone") from None
        raise
    except TreeTooLarge as exc:
        raise _Damage(f"it is nested deeper than {MAX_DEPTH} directories" if exc.bound == "depth"
                      else f"it holds more than {MAX_ENTRIES} entries") from None
    return out


def _kind(st: os.stat_result) -> str:
    return "d" if stat.S_ISDIR(st.st_mode) else ("x" if st.st_mode & stat.S_IXUSR else "f")


def _mode(kind: str) -> int:
    return {"d": DIR_MODE, "x": EXEC_MODE, "f": FILE_MODE}[kind]


def _read_seal(layout: Layout, ident: str) -> dict[str, manifest.Entry] | None:
    """The seal of entry `ident` (path -> its listing line), or None when there is none that parses
    (the entry is then sealed again: its bytes are checked against its RECORD once more)."""
    try:
        data = files.read_bounded(layout.wheel_seals / ident, SEAL_MAX, owner=_EUID, one_link=True)
    except OSError:  # absent, refused (FileRefused is an OSError)
        return None
    try:
        return {e.path: e for e in manifest.parse_contents(data)}
    except ValueError:
        return None


def _check_sealed(entry: Path, seal: dict[str, manifest.Entry]) -> tuple[dict[str, str], dict[str, tuple[int, int]]]:
    """(path -> blake3, path -> inode) of a sealed entry, once it is shown to have the names, kinds,
    sizes, owner and canonical modes its seal records (no byte is read: the tree's scan compares
    the digests of what a build links)."""
    digests: dict[str, str] = {}
    inodes: dict[str, tuple[int, int]] = {}
    for rel, st in _walk(entry):
        if not rel:
            if stat.S_IMODE(st.st_mode) != DIR_MODE:
                raise _Damage(f"its mode is {stat.S_IMODE(st.st_mode):04o}, not {DIR_MODE:04o}")
            continue
        kind = _kind(st)
        want = seal.get(rel)
        if want is None:
            raise _Damage(f"{rel} is not in its seal (added since it was sealed)")
        if want.kind != kind or (kind != "d" and want.size != st.st_size):
            raise _Damage(f"{rel} is not the {'directory' if want.kind == 'd' else 'file'} its seal records")
        if stat.S_IMODE(st.st_mode) != _mode(kind):
            raise _Damage(f"{rel} has mode {stat.S_IMODE(st.st_mode):04o}, not {_mode(kind):04o}")
        if kind != "d":
            # A capability or another attribute set on a linked inode since it was sealed (root can,
            # through any store path that links it) would pass to every environment linking it.
            _no_xattrs(entry / rel, rel)
            digests[rel] = want.digest
            inodes[rel] = (st.st_dev, st.st_ino)
    missing = len(seal) - len(digests) - sum(1 for e in seal.values() if e.kind == "d")
    if missing:
        raise _Damage(f"{missing} entr{'y' if missing == 1 else 'ies'} of its seal are missing")
    return digests, inodes


def _seal(layout: Layout, ident: str, memo: dict) -> tuple[dict[str, str], dict[str, tuple[int, int]]]:
    """Check entry `ident` against its wheel's RECORD, give it canonical modes and time, and write
    its seal; returns what _check_sealed returns and puts each file's digest in `memo`."""
    entry = layout.wheel_home / ident
    items = _walk(entry)
    for rel, _ in items:
        _no_xattrs(entry / rel, rel)
    record, exempt = _record(entry, items)
    regular = [(rel, st) for rel, st in items if stat.S_ISREG(st.st_mode)]
    for rel, _ in regular:
        if rel not in record and rel not in exempt:
            raise _Damage(f"{rel} is not listed in the wheel's RECORD")
    listed = {rel for rel, _ in regular}
    for rel in record:
        if rel not in listed:
            raise _Damage(f"{rel}, listed in the wheel's RECORD, is missing")
    # Files first, then directories deepest first (a directory's own time moves while its entries
    # change): every inode canonical before its bytes are read, so the digests and the inodes'
    # identities (for the scan's memo) are those of the sealed entry.
    hashed = _hash_all(entry, regular, record)
    for rel, st in reversed(items):
        if stat.S_ISDIR(st.st_mode):
            _canonical(entry / rel if rel else entry, "d", _DIR)
    digests: dict[str, str] = {}
    inodes: dict[str, tuple[int, int]] = {}
    lines: list[manifest.Entry] = []
    for rel, st in items[1:]:
        if stat.S_ISDIR(st.st_mode):
            lines.append(manifest.Entry(rel, "d", 0, ""))
            continue
        kind, size, digest, ident_st = hashed[rel]
        lines.append(manifest.Entry(rel, kind, size, digest))
        digests[rel] = digest
        inodes[rel] = (ident_st[0], ident_st[1])
        memo[ident_st] = digest
    _write_seal(layout, ident, manifest.listing(lines))
    return digests, inodes


def _no_xattrs(path: Path, rel: str) -> None:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        raise _Damage(f"{rel or '.'}: {exc.strerror}") from None
    if names:
        raise _Damage(f"{rel or '.'} carries extended attributes ({', '.join(sorted(names))})")


def _record(entry: Path, items: list[tuple[str, os.stat_result]]) -> tuple[dict[str, tuple[str, str, int | None]], set[str]]:
    """The wheel's RECORD as path -> (algorithm, urlsafe-base64 digest, size or None), and the
    files it may list without a digest. The entry must hold exactly one top-level dist-info with a
    RECORD; every other line must give a digest of an allowed algorithm."""
    dists = [rel for rel, st in items if "/" not in rel and rel.endswith(".dist-info") and stat.S_ISDIR(st.st_mode)]
    if len(dists) != 1:
        raise _Damage(f"it holds {len(dists)} top-level dist-info directories, not one")
    dist = dists[0]
    try:
        text = files.read_bounded(entry / dist / "RECORD", RECORD_MAX).decode("utf-8", "surrogateescape")
    except OSError:
        raise _Damage(f"{dist}/RECORD is not a plain file of at most {RECORD_MAX} bytes") from None
    exempt = {f"{dist}/{n}" for n in UNHASHED}
    out: dict[str, tuple[str, str, int | None]] = {}
    for row in csv.reader(io.StringIO(text, newline="")):
        if not row or not row[0]:
            continue
        rel = row[0]
        parts = rel.split("/")
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in rel or "\0" in rel:
            raise _Damage(f"its RECORD lists {rel!r}, which is not a path inside the wheel")
        if rel in out:
            raise _Damage(f"its RECORD lists {rel!r} twice")
        digest = row[1] if len(row) > 1 else ""
        if rel in exempt and not digest:
            continue
        algo, _, value = digest.partition("=")
        if algo not in RECORD_ALGOS or not value:
            raise _Damage(f"its RECORD gives {rel!r} no sha256 (or stronger) digest")
        size = row[2] if len(row) > 2 and row[2] else None
        if size is not None and not size.isdigit():
            raise _Damage(f"its RECORD gives {rel!r} the size {size!r}")
        out[rel] = (algo, value, int(size) if size is not None else None)
    return out, exempt


def _canonical(path: Path, kind: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        _canonical_fd(fd, kind)
    finally:
        os.close(fd)


def _canonical_fd(fd: int, kind: str) -> None:
    st = os.fstat(fd)
    if stat.S_IMODE(st.st_mode) != _mode(kind):
        os.fchmod(fd, _mode(kind))
    if st.st_mtime_ns != WHEEL_MTIME * 10**9 or st.st_atime_ns != WHEEL_MTIME * 10**9:
        os.utime(fd, (WHEEL_MTIME, WHEEL_MTIME))


def _hash_all(entry: Path, files: list[tuple[str, os.stat_result]],
              record: dict[str, tuple[str, str, int | None]]) -> dict[str, tuple[str, int, str, tuple]]:
    """rel -> (kind, size, blake3, memo identity) of every file, each read once in a pool of threads
    (hashing releases the GIL) and checked against its RECORD line; each made canonical by its
    descriptor first. Raises _Damage for the first file that does not match."""
    batches: list[list[str]] = [[]]
    size = 0
    total = sum(st.st_size for _, st in files)
    for rel, st in files:
        if len(batches[-1]) >= BATCH_FILES or size >= BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(rel)
        size += st.st_size
    done = [0]
    step = f"checking {entry.name} against its RECORD"

    def one_batch(rels: list[str]) -> list[tuple[str, Any]]:
        out = []
        for rel in rels:
            out.append((rel, _hash_one(entry / rel, rel, record.get(rel))))
            done[0] += out[-1][1][1]
            progress(step, done[0], total, "B")
        return out

    results: dict[str, tuple] = {}
    if len(batches) == 1:
        results.update(one_batch(batches[0]))
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(THREADS) as pool:
            for part in pool.map(one_batch, batches):
                results.update(part)
    wrong = {rel: r[4] for rel, r in results.items() if r[4] is not None}
    new = sorted(rel for rel, (want, got) in wrong.items() if _RECORD_WRONG.get((rel, want)) != got)
    for rel, (want, got) in wrong.items():
        _RECORD_WRONG[(rel, want)] = got
    if new:
        more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
        raise _Damage(f"{new[0]}{more} does not match the digest the wheel's RECORD gives it")
    if wrong:
        say(f"{entry.name}: the wheel's RECORD is wrong for {len(wrong)} file(s) ({sorted(wrong)[0]}): unpacked "
            "twice from the wheel uv checked against the lock's sha256, the same bytes both times; sealed as unpacked")
    return {rel: r[:4] for rel, r in results.items()}


def _hash_one(path: Path, rel: str, want: tuple[str, str, int | None] | None) -> tuple[str, int, str, tuple, Any]:
    """(kind, size, blake3, memo identity, mismatch) of one file, made canonical, checked against
    `want` (its RECORD line; None for RECORD itself and its signatures); `mismatch` is None, or
    (the RECORD's digest, the file's) when they differ (_hash_all decides)."""
    try:
        fd = os.open(path, _OPEN)
    except OSError as exc:
        raise _Damage(f"{rel} cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != _EUID:
            raise _Damage(f"{rel} changed while it was checked")
        kind = "x" if st.st_mode & stat.S_IXUSR else "f"
        _canonical_fd(fd, kind)
        st = os.fstat(fd)  # after the chmod and utime: the identity the scan's memo is keyed by
        h = hashlib.new(want[0]) if want is not None else None
        b = manifest.hasher(st.st_size)
        if st.st_size >= manifest.MMAP_MIN:  # the store's one threshold (core/manifest.py)
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
                b.update(m)
                if h is not None:
                    h.update(m)
        else:
            try:
                data = files.read_fd(fd, st.st_size, rel)
            except files.FileRefused:  # it grew past its fstat size while being read
                raise _Damage(f"{rel} changed while it was checked") from None
            b.update(data)
            if h is not None:
                h.update(data)
        mismatch = None
        if h is not None and want is not None:
            got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
            if got != want[1].rstrip("="):
                mismatch = (f"{want[0]}={want[1]}", f"{want[0]}={got}")
            elif want[2] is not None and want[2] != st.st_size:
                raise _Damage(f"{rel} is {st.st_size} bytes, not the {want[2]} the wheel's RECORD says")
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return kind, st.st_size, b.hexdigest(), ident, mismatch
    finally:
        os.close(fd)


def _write_seal(layout: Layout, ident: str, data: bytes) -> None:
    """The seal, written whole and renamed into place (system/files.write_atomic: a reader sees no seal
    or all of it, also after a crash). 0600 in the 0700 var/."""
    files.write_atomic(layout.wheel_seals / ident, data, mode=0o600)


# --- evicting ---------------------------------------------------------------------------------------

def evict(layout: Layout, bad: dict[str, list[str]]) -> None:
    """Take the entries named in `bad` out of the wheel home (renamed into the trash, then deleted:
    the store paths that link their files keep them; `verify` names those), with their seals. uv's
    pointers to them dangle: uv fetches and unpacks those wheels again. uv's cache lock is taken if
    it comes within EVICT_LOCK_S (a uv process linking from an entry as it goes fails, and its
    build with it: nothing half-linked is registered)."""
    from contextlib import nullcontext

    lock: AbstractContextManager[None]
    try:
        lock = uv_cache_lock(layout.uv_cache, EVICT_LOCK_S)
        lock.__enter__()
    except (LockTimeout, OSError):
        lock = nullcontext()
    gone = []
    try:
        for ident in bad:
            if not ARCHIVE_RE.fullmatch(ident):
                continue
            src = layout.wheel_home / ident
            dest = layout.trash / f"wheel-{ident}.{os.getpid()}.{time.monotonic_ns()}"
            try:
                fd = os.open(src, _DIR)
                try:
                    os.fchmod(fd, 0o755)  # a directory moved to another parent must be writable by its owner
                finally:
                    os.close(fd)
            except OSError:
                pass
            try:
                os.rename(src, dest)
                gone.append(dest)
            except FileNotFoundError:
                pass
            try:
                os.unlink(layout.wheel_seals / ident)
            except FileNotFoundError:
                pass
    finally:
        lock.__exit__(None, None, None)
    for dest in gone:
        force_rmtree(dest)


# --- what gc asks ----------------------------------------------------------------------------------

def linked(entry: str | os.PathLike[str]) -> bool:
    """Whether any file of the entry has a link outside it (a store path, a build in flight, the
    pool): its installed METADATA first (uv links every wheel's), then every file."""
    try:
        with os.scandir(entry) as it:
            dists = [e.path for e in it if DIST_INFO_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    for d in dists:
        try:
            if os.lstat(os.path.join(d, "METADATA")).st_nlink > 1:
                return True
        except OSError:
            pass
    return any(rel and stat.S_ISREG(st.st_mode) and st.st_nlink > 1 for rel, st in walk(entry, sort=False))
