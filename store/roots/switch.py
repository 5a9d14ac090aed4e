"""The switch as it costs: `activate` of a registered store path and `rollback` to a hot generation,
with nothing on their path but what a switch is (the fast path, cli/fast.py, runs these first).

    activate PROFILE TARGET     TARGET a store path, its name or key, PROFILE or PROFILE@N
    rollback PROFILE [--to N]   N a hot generation (its link and its store path there)

Each is the common case of roots/profiles.py's `activate` and `rollback`, doing exactly what those
do — the same locks in the same order (a temp root under the gc lock held shared, then the
profile's lock with its owner note), the same links, record, history event and index row, the same
result — with only os, _json, _sqlite3 (activate alone) and blake3 loaded: no pathlib, re, json,
dataclasses, typing, datetime or click. Anything else returns None *before anything is changed*, and the caller runs
the full function, which does it all and says what is wrong: a lock another process holds (the
full function waits, naming it), a check to run, a cold generation, temporaries a killed change
left, an index that differs from the links, a pending `--then-check`, records beyond the keep
bound, a history due for rotation, a store whose directories are missing or need their modes fixed,
a target this module cannot resolve, any error. So a switch answered here is one the full function
would have made, byte for byte.

Invariants kept here, as in profiles.py:
- A SIGKILL at any point leaves the profile at the old generation or the new one (rename(2) of a
  link over `profiles/<p>`), and the new generation's link and record exist before it points there.
- Durability: the generation's link, the record and the profile's link are renamed in that order
  in profiles/, the record's data fsynced before the last, and the directory fsynced once: once
  `activate` returns, a power cut keeps the switch. Before that, a journaling filesystem (ext4,
  xfs) replays the renames of one directory in their order, so a power cut never keeps the
  switch without the generation's link and record (it may keep neither, or them without the
  switch). The history's line is fdatasync-ed (records.add_event).
- Nothing grows with the target's size: the lock a record keeps was proved when the path was built
  (or at its first record) and the proof kept (core/proofs.py); here only the manifest's lock text
  is hashed and compared with the kept proof, which names the content hash the index records.
- profiles/ is read once (one scandir) per switch.
- The index is told of the new generation first (its row, before its link: a write the index
  refuses leaves the command to the full function with nothing changed), on a connection that is
  not the last to close:
  a read-only connection of this process holds the database open while the writer closes, so no
  WAL checkpoint runs on the command's path (the commit is in the WAL, synchronous=NORMAL as every
  writer of the index; the next full command or SQLite's autocheckpoint moves it into the file).
"""

from __future__ import annotations

import os
import stat
import time

from llmgw_store.base.errors import StoreError
from llmgw_store.core import indexsql, proofs
from llmgw_store.core import locations as loc
from llmgw_store.core.dirs import NIX_BASE32, PRIVATE_DIR, PUBLIC_DIR, is_store_name, own_dir
from llmgw_store.system import files, jsontext

RECORD_FORMAT = 1  # roots/records.py's FORMAT
RECORD_MAX = 32 << 20  # records.RECORD_MAX
MANIFEST_MAX = 16 << 20  # manifest.MANIFEST_MAX
HISTORY_ROTATE_BYTES = 1 << 20  # records.HISTORY_ROTATE_BYTES
HISTORY_ROOM = 64 << 10  # a history this close to rotation is left to the full function
LIST_MAX = 10_000
PROFILE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")
PROFILE_MAX = 100
GENERATION_MAX = 10**9
FILE_MODE = 0o600
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Leave(Exception):
    """Not the common case: the full function does it (nothing was changed)."""


class _Started:
    """Whether the switch has begun changing the store: before, an error leaves the command to the
    full function (which meets it again and says it as the store says it), but for a full disk,
    raised at once (`_raise_if_full`); after, every error is raised."""

    changing = False


def _pause(point: str) -> None:
    """app/debug.pause, loaded only when its variable is set (a test's barrier): unset, a point
    costs a dict lookup here and no module."""
    if os.environ.get("LLMGW_STORE_DEBUG_" + point):
        from llmgw_store.app import debug

        debug.pause(point)


def _profile_ok(p: object) -> bool:
    """names.check_profile, without re: [a-z0-9][a-z0-9._-]*, at most 100, not `<x>-<N>-link`."""
    if not isinstance(p, str) or not 0 < len(p) <= PROFILE_MAX or p[0] in "._-" or not set(p) <= PROFILE_CHARS:
        return False
    head, _, tail = p.rpartition("-")
    digits = head.rpartition("-")[2]
    return not (tail == "link" and "-" in head and digits.isdigit())


def _number(text: str) -> int | None:
    """A generation number written in ASCII digits (1 to 10^9), else None."""
    if not (0 < len(text) <= 10 and text.isascii() and text.isdigit()):
        return None
    n = int(text)
    return n if 1 <= n <= GENERATION_MAX else None


def _key_ok(text: str) -> bool:
    return len(text) == 32 and all(c in NIX_BASE32 for c in text)


# --- the store's directories, checked as Store.open checks them (without making or fixing any) ---

class _Dirs:
    """ROOT, store/, profiles/, var/, var/locks/, var/temproots/ (and holds/ once made) as descriptors, each a real
    directory of this user's (or root's) that no one else may write (core/dirs.own_dir); the private
    ones with no group or other bits at all (a lax one is the full function's to tighten)."""

    def __init__(self, root: str):
        self.root = root
        self.fds: list[int] = []
        try:
            r = self._open(root, PUBLIC_DIR, None)
            self.store = self._open(loc.at(root, loc.STORE), PUBLIC_DIR, r)
            self.profiles = self._open(loc.at(root, loc.PROFILES), PUBLIC_DIR, r)
            self.var = self._open(loc.at(root, loc.VAR), PRIVATE_DIR, r)
            self.locks = self._open(loc.at(root, loc.LOCKS), PRIVATE_DIR, self.var)
            self.temproots = self._open(loc.at(root, loc.TEMPROOTS), PRIVATE_DIR, self.var)
            if os.path.lexists(loc.at(root, loc.HOLDS)):  # made by the first hold; then checked as the rest
                self._open(loc.at(root, loc.HOLDS), PUBLIC_DIR, r)
        except BaseException:
            self.close()
            raise

    def _open(self, path: str, mode: int, parent: int | None) -> int:
        try:
            fd = own_dir(path, mode, parent, create=False, fix=False)
        except (StoreError, OSError):
            raise _Leave from None
        if fd is None:
            raise _Leave
        self.fds.append(fd)
        if stat.S_IMODE(os.fstat(fd).st_mode) & ~mode:
            raise _Leave
        return fd

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


# --- locks (core/locks.py, core/temproots.py): the same files, never waited for here ----------

def _flock(dir_fd: int, name: str, shared: bool) -> int:
    """flock(2) on the lock file `name` (made 0600, never through a link) without waiting: _Leave
    when another process holds it (the full function waits, naming the holder)."""
    import fcntl

    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _Leave from None
    except BaseException:
        os.close(fd)
        raise
    return fd


class _ProfileLock:
    """var/locks/profile-<p>.lock held exclusively, with its owner note (locks.flock)."""

    def __init__(self, dirs: _Dirs, profile: str):
        self.dirs, self.name = dirs, loc.profile_lock_name(profile)
        self.fd = _flock(dirs.locks, self.name + ".lock", shared=False)
        note = jsontext.line({"pid": os.getpid(), "host": os.uname().nodename, "what": f"changing profile {profile}",
                           "since": time.time()})
        try:
            files.write_atomic(self.name + ".owner", note.encode(), dir_fd=dirs.locks, mode=0o600, fsync=False)
        except OSError:
            pass  # the note is advisory (locks._write_note)

    def release(self) -> None:
        try:
            os.unlink(self.name + ".owner", dir_fd=self.dirs.locks)  # before the flock goes
        except FileNotFoundError:
            pass
        finally:
            os.close(self.fd)


_temproots_fd: list[int] = []  # this process's temp-roots file, kept open (and flocked) until it exits


def _temp_root(dirs: _Dirs, name: str) -> None:
    """TempRoots.add: `name` appended to this process's temp-roots file under the gc lock held
    shared (never waited for here), the file made O_EXCL with a fresh token and flocked for life."""
    import fcntl

    gc = _flock(dirs.locks, "gc.lock", shared=True)
    try:
        for _ in range(3 if not _temproots_fd else 0):
            try:
                fd = os.open(f"{os.getpid()}-{os.urandom(8).hex()}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                             | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dirs.temproots)
            except FileExistsError:
                continue  # a name taken is never removed: another token
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # made just now, by this process alone
            _temproots_fd.append(fd)
            break
        if not _temproots_fd:
            raise _Leave
        os.write(_temproots_fd[0], (name + "\n").encode())
    finally:
        os.close(gc)


# --- profiles/ read once ------------------------------------------------------------------------

class _Scan:
    """One pass over profiles/ for `profile`: its generation links (number -> store path name), the
    numbers that have a record, and whether a killed change left temporaries."""

    def __init__(self, dirs: _Dirs, profile: str):
        self.gens: dict[int, str] = {}
        self.records: list[int] = []
        link_head, rec_head = profile + "-", "." + profile + "-"
        with os.scandir(dirs.profiles) as it:
            for entry in it:
                n = entry.name
                if n.startswith(link_head) and n.endswith(loc.LINK_SUFFIX):
                    number = _number(n[len(link_head):-len(loc.LINK_SUFFIX)])
                    if number is not None and entry.is_symlink():
                        self.gens[number] = os.readlink(n, dir_fd=dirs.profiles).rpartition("/")[2]
                elif n.startswith("." + profile) or n.startswith(".." + profile):
                    if ".tmp-" in n:
                        raise _Leave  # what a killed change left: the full function clears it
                    if n.startswith(rec_head) and n.endswith(".record"):
                        number = _number(n[len(rec_head):-7])
                        if number is not None:
                            self.records.append(number)

    def agrees(self, rows: dict[int, tuple[str, object]]) -> bool:
        """Whether the index's generations (`_Index.generations`) are these links: each link a
        live row of its name, each live row a link. When not, the full function repairs it."""
        return (all(n in rows and rows[n][1] is None and rows[n][0] == g for n, g in self.gens.items())
                and all(n in self.gens or deleted is not None for n, (_, deleted) in rows.items()))


def _current(dirs: _Dirs, profile: str) -> int | None:
    """The profile's current generation; None when there is no profile yet. _Leave when its link is
    not one of its generations (the full function says so)."""
    try:
        target = os.readlink(profile, dir_fd=dirs.profiles)
    except FileNotFoundError:
        return None
    except OSError:
        raise _Leave from None
    head = profile + "-"
    number = _number(target[len(head):-len(loc.LINK_SUFFIX)]) \
        if target.startswith(head) and target.endswith(loc.LINK_SUFFIX) else None
    if number is None:
        raise _Leave
    return number


def _no_pending_check(dirs: _Dirs, profile: str, current: int | None) -> None:
    """profiles._settle_abandoned_check has nothing to do: the current generation's record says no
    `--then-check` is pending (one that may is the full function's to settle)."""
    if current is None:
        return
    try:
        raw = files.read_bounded(loc.record_file(profile, current), RECORD_MAX, dir_fd=dirs.profiles, owner=os.geteuid(),
                                 deny_mode=0o022, one_link=True, tighten=0o044)
    except FileNotFoundError:
        return
    except OSError:
        raise _Leave from None
    if b"pending" in raw:
        raise _Leave


def _history_checked(dirs: _Dirs, profile: str) -> None:
    """Before anything changes: the profile's history, if it exists, is a plain file of ours closed
    to others and not due for rotation (else _Leave: the full function's add_event fixes its mode,
    or rotates it). Nothing is created here."""
    try:
        st = os.lstat(loc.history_file(profile), dir_fd=dirs.profiles)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_nlink != 1 \
            or st.st_size + HISTORY_ROOM > HISTORY_ROTATE_BYTES:
        raise _Leave


def _event(dirs: _Dirs, profile: str, event: str, **fields: object) -> None:
    """records.add_event: one JSON line appended (O_APPEND, never through a link) and fdatasync-ed."""
    from llmgw_store.base.report import said

    entry = {"event": event, "at": now_iso(), "by": who(), **fields}
    shown = loc.at(dirs.root, loc.PROFILES) + "/" + loc.history_file(profile)
    try:
        fd = os.open(loc.history_file(profile), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, FILE_MODE, dir_fd=dirs.profiles)
    except OSError as exc:
        said(f"cannot record the event in {shown}: {exc.strerror}")
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
            said(f"not recording the event: {shown} is not a plain file of ours")
            return
        os.write(fd, jsontext.line(entry).encode() + b"\n")
        os.fdatasync(fd)
    finally:
        os.close(fd)


def now_iso() -> str:
    """index.now_iso without datetime."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def who() -> dict[str, object]:
    """records.who."""
    out: dict[str, object] = {"uid": os.getuid(), "user": indexsql.user()[:64]}
    sudo = os.environ.get("SUDO_USER")
    if sudo:
        out["sudo_user"] = sudo[:64]
    return out


def _symlink(dirs: _Dirs, target: str, link: str) -> None:
    """links.symlink_atomically in profiles/, without its directory fsync (the caller's)."""
    tmp = f".{link}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp, dir_fd=dirs.profiles)
    except FileNotFoundError:
        pass
    os.symlink(target, tmp, dir_fd=dirs.profiles)
    os.rename(tmp, link, src_dir_fd=dirs.profiles, dst_dir_fd=dirs.profiles)


def _result(profile: str, generation: int, previous: int | None, path: str, changed: bool) -> dict[str, object]:
    """profiles.Switch(...).to_json()."""
    return {"schema_version": 1, "profile": profile, "generation": generation, "previous": previous, "path": path,
            "changed": changed, "check": None, "rebuilt": None}


# --- the lock a record keeps, proved once -------------------------------------------------------

def _described(dirs: _Dirs, key: bytes, row: dict) -> dict[str, object]:
    """records.describe of the registered path `row`, its lock proved by the kept proof (the
    manifest's lock text hashes to the proof's digest); _Leave without one."""
    from blake3 import blake3

    name = row["name"]
    proof = proofs.recall(dirs.var, key, name, row["content_hash"])
    if proof is None:
        raise _Leave
    try:
        env = files.open_dir(name, dir_fd=dirs.store)
        try:
            doc = jsontext.loads(files.read_bounded(".llmgw/manifest.json", MANIFEST_MAX, dir_fd=env))
        finally:
            os.close(env)
    except (OSError, ValueError):
        raise _Leave from None
    if not isinstance(doc, dict) or doc.get("name") != name or doc.get("key") != name[:32] \
            or doc.get("lock_format") != proof["lock_format"] or not isinstance(doc.get("lock"), str) \
            or blake3(doc["lock"].encode()).hexdigest() != proof["lock_blake3"]:
        raise _Leave
    reqs = doc.get("requirements", [])
    if not isinstance(reqs, list):
        raise _Leave
    inputs = jsontext.loads(row["inputs"]) if isinstance(row["inputs"], str) else {}
    return {"name": name, "key": row["key"], "content_hash": row["content_hash"], "engine": row["engine"],
            "version": row["version"], "variant": row["variant"], "inputs": inputs,
            "requirements": [r for r in reqs if isinstance(r, str)][:LIST_MAX], "lock_format": doc["lock_format"],
            "lock": doc["lock"], "lock_blake3": proof["lock_blake3"]}


def _health_recorded(inputs: object) -> bool:
    """Whether the recipe recorded a `health` command (health.recipe_health would run one)."""
    build = inputs.get("build") if isinstance(inputs, dict) else None
    return isinstance(build, dict) and build.get("health") is not None


# --- the index ------------------------------------------------------------------------------------

# What integrity/reads.py shares with the switch: the same names check.
profile_ok = _profile_ok


class _Index:
    """The index opened as Index opens it for a writer (WAL, synchronous=NORMAL, foreign keys), its
    schema version checked, the database file a private regular file of ours."""

    def __init__(self, root: str, var_fd: int, timeout: float):
        sqlite3 = indexsql.sqlite_module()

        try:
            fd = os.open(loc.leaf(loc.DB), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=var_fd)
        except OSError:
            raise _Leave from None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise _Leave
        self.sqlite3 = sqlite3
        self.path = loc.at(root, loc.DB)
        self.timeout = min(timeout, 30.0)
        self.conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal" \
                    or self.conn.execute("PRAGMA user_version").fetchone()[0] != indexsql.SCHEMA_VERSION \
                    or self.conn.execute("PRAGMA application_id").fetchone()[0] == 0:
                raise _Leave
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            self.conn.close()
            raise

    def row(self, column: str, value: str) -> dict | None:
        cur = self.conn.execute(indexsql.PATH_BY[column], (value,))
        found = cur.fetchone()
        if found is None:
            return None
        row = dict(zip([d[0] for d in cur.description], found, strict=True))
        return row if is_store_name(row["name"]) else None

    def generations(self, profile: str) -> dict[int, tuple[str, object]]:
        return {n: (name, deleted) for n, name, deleted in
                self.conn.execute(indexsql.GENERATIONS_OF, (profile,))}

    def record_generation(self, profile: str, number: int, name: str, created: str) -> None:
        """Index.record_generation (one statement, its own transaction)."""
        self.conn.execute(indexsql.RECORD_GENERATION, (profile, number, name, created, indexsql.whoami()))

    def close(self) -> None:
        """Close without a WAL checkpoint: a read-only connection holds the database open while the
        writer closes (the writer is then not the last one and leaves the WAL as it is); the
        read-only one cannot checkpoint."""
        try:
            reader = self.sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=self.timeout,
                                          isolation_level=None)
        except self.sqlite3.Error:
            self.conn.close()
            return
        try:
            reader.execute("PRAGMA user_version").fetchone()
        except self.sqlite3.Error:
            pass
        self.conn.close()
        reader.close()


# --- the two switches -----------------------------------------------------------------------------

def _resolve(dirs: _Dirs, index: _Index, target: str) -> dict | None:
    """resolve.reference for what needs no more than a name: PROFILE@N, PROFILE, a store path's
    name or its key, a path ending in one; None for the rest (the full function resolves it)."""
    if not target or len(target) > 4096 or "\0" in target:
        return None
    profile, at, number = target.partition("@")
    if at:
        n = _number(number)
        if not _profile_ok(profile) or n is None:
            return None
        try:
            name = os.readlink(loc.generation_link(profile, n), dir_fd=dirs.profiles).rpartition("/")[2]
        except OSError:
            return None
        return index.row("name", name) if is_store_name(name) else None
    if _profile_ok(target):
        try:
            st = os.lstat(target, dir_fd=dirs.profiles)
        except OSError:
            st = None
        if st is not None:
            if not stat.S_ISLNK(st.st_mode):
                return None
            current = _current(dirs, target)
            if current is None:  # gone since the lstat: the full command says what is there
                return None
            try:
                name = os.readlink(loc.generation_link(target, current), dir_fd=dirs.profiles).rpartition("/")[2]
            except OSError:
                return None
            return index.row("name", name) if is_store_name(name) else None
    name = target.rstrip("/").rpartition("/")[2]
    if is_store_name(name):
        row = index.row("name", name)
        if row is not None or "/" not in target:
            return row
    elif _key_ok(name):
        return index.row("key", name)
    return None


def activate(root: str, profile: str, target: str, *, lock_timeout: float, no_check: bool,
             keep_records: int) -> tuple[dict[str, object], str] | None:
    """profiles.activate(profile, target) without a check: (the result document, the store path
    name), or None, nothing changed, to leave it to the full function."""
    if not _profile_ok(profile) or not 1 <= keep_records:
        return None
    try:
        dirs = _Dirs(root)
    except _Leave:
        return None
    index, started = None, _Started()
    try:
        key = proofs.secret(dirs.var)
        if key is None:
            return None
        index = _Index(root, dirs.var, lock_timeout)
        row = _resolve(dirs, index, target)
        if row is None:
            return None
        name = row["name"]
        _temp_root(dirs, name)
        row = index.row("name", name)  # again, now that gc can no longer take it
        if row is None or not os.path.isdir(f"{root}/store/{name}") or os.path.islink(f"{root}/store/{name}"):
            return None
        described = _described(dirs, key, row)
        if not no_check and _health_recorded(described["inputs"]):
            return None
        lock = _ProfileLock(dirs, profile)
        try:
            return _activate_locked(dirs, index, key, profile, name, described, keep_records, started)
        finally:
            lock.release()
    except _Leave:
        return None
    except Exception as exc:
        if started.changing:
            raise
        _raise_if_full(exc, root, lock_timeout)
        return None
    finally:
        if index is not None:
            index.close()
        dirs.close()


def unchanged(root: str, profile: str, name: str, *, no_check: bool, unless_held: bool) -> dict[str, object] | None:
    """profiles.activate(profile, name)'s answer when `name` is the profile's current generation
    already (no generation made, no check run): its result document, checked under the profile's
    lock as that function checks it — the index agrees with the links, no temporaries, no pending
    `--then-check`, `name` registered and on disk, and (`unless_held`) the profile not held — and
    its one line when the recipe has a `health` command (unless `no_check`). None otherwise,
    nothing changed: the full function decides (and repairs what it repairs)."""
    if not _profile_ok(profile) or not is_store_name(name):
        return None
    try:
        dirs = _Dirs(root)
    except _Leave:
        return None
    index = None
    try:
        index = _Index(root, dirs.var, 30.0)
        row = index.row("name", name)
        if row is None or row["key"] != name[:32] or not _hot(dirs, name) or os.path.islink(f"{root}/store/{name}"):
            return None
        lock = _ProfileLock(dirs, profile)
        try:
            if unless_held and os.path.lexists(f"{root}/holds/{profile}"):
                return None  # held: the full function says so
            scan = _Scan(dirs, profile)
            if not scan.agrees(index.generations(profile)):
                return None
            current = _current(dirs, profile)
            _no_pending_check(dirs, profile, current)
            if current is None or scan.gens.get(current) != name:
                return None
            if not no_check and _health_recorded(jsontext.loads(row["inputs"]) if isinstance(row["inputs"], str)
                                                 else None):
                from llmgw_store.base.report import said

                said(f"check: the health command of {name}'s recipe")  # as profiles.activate says it, unrun
            return _result(profile, current, current, f"{root}/store/{name}", False)
        finally:
            lock.release()
    except _Leave:
        return None
    except Exception as exc:
        _raise_if_full(exc, root, 30.0)
        return None
    finally:
        if index is not None:
            index.close()
        dirs.close()


def _activate_locked(dirs: _Dirs, index: _Index, key: bytes, profile: str, name: str, described: dict,
                     keep_records: int, started: _Started) -> tuple[dict[str, object], str] | None:
    from blake3 import blake3

    from llmgw_store.base.report import said

    scan = _Scan(dirs, profile)
    rows = index.generations(profile)
    if not scan.agrees(rows):
        return None  # the index differs from the links: the full function repairs it
    current = _current(dirs, profile)
    _no_pending_check(dirs, profile, current)
    path = f"{dirs.root}/store/{name}"
    if current is not None and scan.gens.get(current) == name:
        return _result(profile, current, current, path, False), name
    if len(scan.records) + 1 > keep_records:
        return None  # records to prune: the full function's
    number = max([*scan.gens, *scan.records, *rows, 0]) + 1
    _history_checked(dirs, profile)
    link = loc.generation_link(profile, number)
    activation = {"kind": "activate", "from": current, "check": None}
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"format": RECORD_FORMAT, "profile": profile, "generation": number, **described, "created": created,
            "by": who(), "activation": activation}
    body["lock_blake3"] = blake3(body["lock"].encode()).hexdigest()
    digest = blake3(jsontext.canonical(body), key=key).hexdigest()
    data = jsontext.indented({**body, "digest": digest}).encode() + b"\n"
    # The index first: a write it refuses (a full disk, a lock held past the timeout) leaves the
    # command to the full function with nothing changed. Its row names generation N before the link
    # does; a change killed in between leaves a row without a link, which the next change marks
    # deleted (profiles._sync_index), the number never reused.
    index.record_generation(profile, number, name, created)
    started.changing = True
    _symlink(dirs, f"../store/{name}", link)
    # The record is on disk before the profile points at the generation (records.write).
    files.write_atomic(loc.record_file(profile, number), data, dir_fd=dirs.profiles, mode=FILE_MODE, fsync=False)
    _fsync_record(dirs, loc.record_file(profile, number))
    from llmgw_store.roots import summary

    summary.note(dirs.profiles, profile, key, number, body, first=not scan.records)  # as records.write does
    _pause("BEFORE_SWITCH")
    _symlink(dirs, link, profile)
    os.fsync(dirs.profiles)  # the three names at once: the generation's link, its record, the switch
    _pause("AFTER_SWITCH")
    _event(dirs, profile, "activate", **{"from": current}, to=number, name=name, check=None)
    said(f"profile {profile}: generation {number} -> {name}")
    return _result(profile, number, current, path, True), name


def _fsync_record(dirs: _Dirs, filename: str) -> None:
    fd = os.open(filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirs.profiles)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rollback(root: str, profile: str, to: int | None) -> dict[str, object] | None:
    """profiles.rollback(profile, to=to) to a hot generation: the result document, or None, nothing
    changed, to leave it to the full function (a cold generation, a missing one, ...)."""
    if not _profile_ok(profile) or (to is not None and _number(str(to)) != to):
        return None
    try:
        dirs = _Dirs(root)
    except _Leave:
        return None
    started = _Started()
    try:
        lock = _ProfileLock(dirs, profile)
        try:
            return _rollback_locked(dirs, profile, to, started)
        finally:
            lock.release()
    except _Leave:
        return None
    except Exception as exc:
        if started.changing:
            raise
        _raise_if_full(exc, root, 30.0)
        return None
    finally:
        dirs.close()


def _raise_if_full(exc: Exception, root: str, timeout: float) -> None:
    """A full disk (or quota) is the command's answer, not a reason to go on to the full function:
    what that one would then write is where the disk would refuse it, maybe after its first change.
    Raised as the store says it (an OSError: output.translated; SQLite's: index.store_error)."""
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise exc
    if type(exc).__module__ in ("sqlite3", "_sqlite3"):
        import _sqlite3  # loaded already: exc is one of its errors

        if not (isinstance(exc, _sqlite3.Error) and exc.sqlite_errorcode & 0xFF == 13):  # 13: SQLITE_FULL
            return
        from pathlib import Path

        from llmgw_store.core.index import store_error

        db = Path(loc.at(root, loc.DB))
        raise store_error(db, f"index {db}", exc, min(timeout, 30.0)) from exc  # 13: SQLITE_FULL


def _hot(dirs: _Dirs, name: str) -> bool:
    """records.present: store/<name> is a directory (on disk: the generation is hot)."""
    try:
        return is_store_name(name) and stat.S_ISDIR(os.stat(name, dir_fd=dirs.store).st_mode)
    except OSError:
        return False


def _rollback_locked(dirs: _Dirs, profile: str, to: int | None, started: _Started) -> dict[str, object] | None:
    from llmgw_store.base.report import said

    current = _current(dirs, profile)
    if current is None:
        return None
    _no_pending_check(dirs, profile, current)
    scan = _Scan(dirs, profile)
    gens = scan.gens
    if to is None:
        older = [n for n in gens if n < current and _hot(dirs, gens[n])]
        if not older:
            return None
        to = max(older)
    if to not in gens or not _hot(dirs, gens[to]):
        return None  # cold, or no such generation
    name = gens[to]
    path = f"{dirs.root}/store/{name}"
    if to == current:
        return _result(profile, to, current, path, False)
    _history_checked(dirs, profile)
    started.changing = True
    _symlink(dirs, loc.generation_link(profile, to), profile)
    os.fsync(dirs.profiles)
    _pause("AFTER_SWITCH")
    _event(dirs, profile, "rollback", **{"from": current}, to=to, name=name, cold=False)
    said(f"profile {profile}: generation {current} -> {to} ({name})")
    return _result(profile, to, current, path, True)
