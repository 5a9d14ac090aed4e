"""`list`, `info` and `env` as they cost: the result documents of integrity/queries.py's
`list_paths` and `path_info` and of roots/runenv.py's `env_lines`, read with nothing on their path but what a read is (the fast path, cli/fast.py, asks
here first): os, _json, _sqlite3 and the directory check; no pathlib, re, json, dataclasses,
typing or click.

Each answers the common case exactly as the full function does — the store's directories
checked as Store.open(readonly=True) checks them (core/layout.Layout.check: every one that exists,
nothing made or fixed), the index opened read-only (`mode=ro`) at the schema version this
llmgw-store reads, the same rows in the same order, the same document — and returns None for
anything else, having printed and changed nothing: no store at the root, a directory or index
the full function would refuse or complain of, a malformed row (the full `list` says it skips
it), a target this module cannot resolve, a manifest that is not plain JSON in a plain file, any
error. The caller then runs the full function, which does it all and says what is wrong.
tests/integrity/test_reads.py runs both ways on a real store and compares their output byte for byte.
"""

from __future__ import annotations

import os
import stat
import time

from llmgw_store.core import indexsql
from llmgw_store.core import locations as loc
from llmgw_store.core.dirs import NIX_BASE32, is_store_name, own_dir
from llmgw_store.system import files, jsontext

# Layout.dir_modes, relative to ROOT, parents before children (tests/integrity/test_reads.py).
DIRS = loc.DIRS
# queries.PathRow's fields and index.BuildLogEntry's, in their order (tests/integrity/test_reads.py).
PATH_FIELDS = ("name", "path", "key", "engine", "version", "variant", "as_of", "uv_version", "python", "inputs",
               "content_hash", "size", "files", "build_seconds", "created", "last_used")
BUILD_FIELDS = ("id", "key", "name", "pid", "host", "started", "finished", "outcome", "seconds", "error")
MANIFEST_MAX = 16 << 20  # manifest.MANIFEST_MAX
TARGET_MAX = 4096
# What urllib.parse.quote leaves as it is in the index's URI (the rest is left to the full function).
_URI_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-~/")
PROFILE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")


class _Leave(Exception):
    """Not the common case: the full function answers (nothing was printed or changed)."""


def _checked(root: str) -> dict[str, int]:
    """Layout.check: each directory of the store that exists (its parent checked first) opened and
    checked by core/dirs.own_dir, nothing made or fixed; {relative path: descriptor}. _Leave for
    a refusal, or a store without its index (the full function says either)."""
    fds: dict[str, int] = {}
    try:
        for rel, mode in DIRS:
            parent = fds.get(rel.rpartition("/")[0]) if rel else None
            if rel and parent is None:
                continue  # its parent is missing
            fd = own_dir(f"{root}/{rel}" if rel else root, mode, parent, create=False, fix=False)
            if fd is None:
                if rel in (loc.ROOT, loc.STORE, loc.VAR):
                    raise _Leave  # no store here: the full function says so
                continue
            fds[rel] = fd
    except BaseException as exc:
        _close(fds)
        if isinstance(exc, Exception):
            raise _Leave from None
        raise
    return fds


def _close(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)


def _connect(root: str, var_fd: int):
    """The index opened as Index(readonly=True) opens it, at indexsql.SCHEMA_VERSION; _Leave otherwise."""
    try:
        st = os.stat(loc.leaf(loc.DB), dir_fd=var_fd, follow_symlinks=False)
    except OSError:
        raise _Leave from None
    path = loc.at(root, loc.DB)
    if not stat.S_ISREG(st.st_mode) or not set(path) <= _URI_SAFE:
        raise _Leave
    sqlite3 = indexsql.sqlite_module()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0, isolation_level=None)
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] != indexsql.SCHEMA_VERSION:
            raise _Leave
    except BaseException:
        conn.close()
        raise
    return conn


def _path_row(root: str, row: dict) -> dict:
    """queries.PathRow.of(...).body() for an index row (its name checked)."""
    if not is_store_name(row["name"]):
        raise _Leave  # the full function skips it and says so (list) or refuses it (info)
    inputs = jsontext.loads(row["inputs"])
    return {f: f"{root}/store/{row['name']}" if f == "path" else inputs if f == "inputs" else row[f]
            for f in PATH_FIELDS}


def _answer(root: str, work):
    """`work(fds, conn)`'s answer, or None where the full function must answer."""
    try:
        fds = _checked(root)
    except _Leave:
        return None
    conn = None
    try:
        conn = _connect(root, fds[loc.VAR])
        return work(fds, conn)
    except Exception:
        return None
    finally:
        if conn is not None:
            conn.close()
        _close(fds)


def list_paths(root: str) -> dict | None:
    """queries.list_paths(root).to_json(), or None to leave it to the full function."""
    def work(_fds, conn) -> dict:
        rows = indexsql.rows(conn, indexsql.PATHS_IN_ORDER)
        return {"schema_version": 1, "paths": [_path_row(root, r) for r in rows]}

    return _answer(root, work)


def path_info(root: str, target: str) -> dict | None:
    """queries.path_info(target, root).to_json(), or None to leave it to the full function."""
    def work(fds, conn) -> dict | None:
        row = _resolve(root, fds.get(loc.PROFILES), conn, target)
        if row is None:
            return None
        body = _path_row(root, row)
        builds = indexsql.rows(conn, indexsql.BUILDS_OF_KEY, (row["key"],))
        return {"schema_version": 1, **body, "manifest": _manifest(fds[loc.STORE], row["name"]),
                "builds": [{f: b[f] for f in BUILD_FIELDS} for b in builds]}

    return _answer(root, work)


def _manifest(store_fd: int, name: str) -> dict | None:
    """manifest.read(path) if path.is_dir() else None: _Leave for what the full function would
    refuse or follow (a link), or read otherwise than as plain JSON."""
    try:
        st = os.stat(name, dir_fd=store_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise _Leave  # is_dir() follows it; the full function says what it finds
    if not stat.S_ISDIR(st.st_mode):
        return None
    fd = files.open_dir(name, dir_fd=store_fd)
    try:
        data = files.read_bounded(".llmgw/manifest.json", MANIFEST_MAX, dir_fd=fd)
    finally:
        os.close(fd)
    doc = jsontext.loads(data)
    if not isinstance(doc, dict):
        raise _Leave
    return doc


def _one(conn, column: str, value: str) -> dict | None:
    rows = indexsql.rows(conn, indexsql.PATH_BY[column], (value,))
    return rows[0] if rows else None


def _profile_ok(p: str) -> bool:
    """names.check_profile, without re (roots/switch.py's)."""
    from llmgw_store.roots.switch import profile_ok

    return profile_ok(p)


def _resolve(root: str, profiles_fd: int | None, conn, target: str) -> dict | None:
    """resolve.reference for PROFILE@N, PROFILE, a store path's name or key, or ROOT/store/NAME;
    None for anything else (the full function resolves it, or says why not)."""
    if not target or len(target) > TARGET_MAX or "\0" in target or not target.isprintable():
        return None
    profile, at, number = target.partition("@")
    if at or _profile_ok(target):
        if profiles_fd is None:
            return None
        if at:
            if not _profile_ok(profile) or not (0 < len(number) <= 10 and number.isascii() and number.isdigit()) \
                    or not 1 <= int(number) <= 10**9:
                return None
            link = loc.generation_link(profile, int(number))
        else:
            try:
                if not stat.S_ISLNK(os.stat(target, dir_fd=profiles_fd, follow_symlinks=False).st_mode):
                    return None
                link = os.readlink(target, dir_fd=profiles_fd)
            except FileNotFoundError:
                link = None  # not a profile: a name or a key
            except OSError:
                return None
            if link is not None:
                n = loc.generation_of(target, link)  # and written as the store writes it, 10 digits at most
                if n is None or not 0 < n < 10**10 or link != loc.generation_link(target, n):
                    return None
        if link is not None:
            try:
                name = os.readlink(link, dir_fd=profiles_fd)
            except OSError:
                return None
            if not name.startswith("../store/"):
                return None
            name = name[len("../store/"):]
            return _one(conn, "name", name) if is_store_name(name) else None
    if target.startswith("/"):
        name = target[len(root) + len("/store/"):] if target.startswith(root + "/store/") else ""
        return _one(conn, "name", name) if is_store_name(name) else None
    if is_store_name(target):
        return _one(conn, "name", target)
    if len(target) == 32 and all(c in NIX_BASE32 for c in target):
        return _one(conn, "key", target)
    return None


def env_lines(root: str, target: str, path_env: str) -> dict | None:
    """runenv.env_lines(target, root=root).to_json() (`path_env`: $PATH), or None to leave it to the
    full function. A PROFILE gives the profile's link (a shell then follows later switches)."""
    def work(fds, conn) -> dict | None:
        profiles = fds.get(loc.PROFILES)
        if profiles is not None and _profile_ok(target):
            try:
                st = os.stat(target, dir_fd=profiles, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None:
                if not stat.S_ISLNK(st.st_mode) or _resolve(root, profiles, conn, target) is None:
                    return None  # not a profile's link, or one that names no registered generation
                env_dir = f"{root}/profiles/{target}"
                return {"schema_version": 1, "variables": {"VIRTUAL_ENV": env_dir, "PATH": f"{env_dir}/bin:{path_env}"}}
        row = _resolve(root, profiles, conn, target)
        if row is None or not is_store_name(row["name"]):
            return None
        env_dir = f"{root}/store/{row['name']}"
        return {"schema_version": 1, "variables": {"VIRTUAL_ENV": env_dir, "PATH": f"{env_dir}/bin:{path_env}"}}

    return _answer(root, work)


_SHELL_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def shell_quoted(s: str) -> str:
    """shlex.quote(s), without `re` (tests/integrity/test_reads.py compares them)."""
    if not s:
        return "''"
    if set(s) <= _SHELL_SAFE:
        return s
    return "'" + s.replace("'", "'\"'\"'") + "'"


# -- generations PROFILE -----------------------------------------------------------------------------

# profiles.COMES_FROM (tests/integrity/test_reads.py checks they agree): a cold generation's way back.
COMES_FROM = {
    "caches": "the configured caches only",
    "caches, else record": "the configured caches, else rebuilt from its record",
    "record": "rebuilt from its record (no cache configured)",
    "nowhere": "none: no cache configured, and no rebuild (substitute-only, or no lock recorded)",
}
HISTORY_LAST = 50  # profiles.generations lists the last 50 events
HISTORY_MAX_BYTES = 8 << 20  # records.HISTORY_MAX_BYTES
_NONE = {"engine": None, "version": None, "variant": None}  # neither an index row nor a record
_SHOWN = ("name", "created", "engine", "version", "variant", "rebuildable", "check", "rolled_back_to")


def generations(root: str, profile: str, substituters: tuple[str, ...], substitute_only: bool) -> dict | None:
    """profiles.generations(profile, root=root, ...).to_json(), or None to leave it to the full
    function: a profile whose links, records, index rows and summary agree (the full function
    then says nothing on stderr), every record's summary entry current (roots/summary.py: its
    stamp the record file's, its digest the records key's), no hold, a history of ours closed to
    others. Reads one summary file, not a record per generation; writes nothing."""
    from llmgw_store.roots.switch import profile_ok

    if not profile_ok(profile):
        return None

    def work(fds, conn) -> dict | None:
        profiles = fds.get("profiles")
        if profiles is None:
            return None
        try:
            target = os.readlink(profile, dir_fd=profiles)
        except OSError:
            return None  # no such profile (the full function says so), or not a link
        current = _link_number(target, profile)
        if current is None:
            return None
        links, numbers = _scan(profiles, profile)
        rows = {n: (name, deleted) for n, name, deleted in
                conn.execute(indexsql.GENERATIONS_OF, (profile,))}
        if any(n not in rows or rows[n][1] or rows[n][0] != name for n, (name, _) in links.items()) \
                or any(n not in links and not deleted for n, (_, deleted) in rows.items()):
            return None  # the index differs from the links: the full function says where
        shown = _summarised(fds["var"], profiles, profile, numbers)
        if shown is None or _held(root, profile):
            return None
        paths = {r["name"]: r for r in indexsql.rows(conn, indexsql.PATH_KINDS)}
        if not all(map(is_store_name, paths)):
            return None  # the full function skips a malformed row and says so
        out: list[dict] = []
        seen: dict[str, bool] = {}
        for number in sorted(set(links) | set(shown)):
            rec = shown.get(number)
            linked = number in links
            name = links[number][0] if linked else rec["name"]  # type: ignore[index]
            hot = seen.get(name)
            if hot is None:  # once per store path, not per generation
                if not is_store_name(name):
                    return None  # layout.path_of refuses it: the full function says so
                hot = seen[name] = os.path.isdir(f"{root}/store/{name}")
            facts = paths.get(name) or rec or _NONE
            out.append({
                "number": number, "path": f"{root}/store/{name}", "name": name,
                "created": _utc(links[number][1]) if linked else rec["created"],  # type: ignore[index]
                "current": number == current,
                "engine": facts["engine"], "version": facts["version"], "variant": facts["variant"],
                "state": "hot" if hot else "cold", "record": rec is not None, "linked": linked,
                "check": rec["check"] if rec else None, "rolled_back_to": rec["rolled_back_to"] if rec else None,
                "comes_from": None if hot else _comes_from(rec, substituters, substitute_only),
            })
        history = _history(profiles, profile)
        if history is None:
            return None
        return {"schema_version": 1, "profile": profile, "current": current, "generations": out,
                "index_differs": [], "records_refused": [], "history": history, "held": None}

    return _answer(root, work)


def _link_number(target: str, profile: str) -> int | None:
    """N of `<profile>-<N>-link` in ASCII digits (1 to 10^9); None for anything else."""
    head = profile + "-"
    if not (target.startswith(head) and target.endswith(loc.LINK_SUFFIX)):
        return None
    digits = target[len(head):-len(loc.LINK_SUFFIX)]
    if not (0 < len(digits) <= 10 and digits.isascii() and digits.isdigit()):
        return None
    n = int(digits)
    return n if 1 <= n <= 10**9 else None


def _scan(profiles: int, profile: str) -> tuple[dict[int, tuple[str, float]], list[int]]:
    """generations.scan_profile: one pass over profiles/ (_Leave where its `\\d` would read a name
    this parser does not: non-ASCII digits, two spellings of one number)."""
    links: dict[int, tuple[str, float]] = {}
    numbers: list[int] = []
    link_head, rec_head = profile + "-", "." + profile + "-"
    with os.scandir(profiles) as it:
        for entry in it:
            n = entry.name
            if n.startswith(rec_head) and n.endswith(".record"):
                digits = n[len(rec_head):-7]
                if digits.isdigit():
                    if not digits.isascii():
                        raise _Leave
                    if len(digits) <= 10 and 1 <= int(digits) <= 10**9:
                        numbers.append(int(digits))
            elif n.startswith(link_head) and n.endswith(loc.LINK_SUFFIX) and n[len(link_head):-len(loc.LINK_SUFFIX)].isdigit():
                digits = n[len(link_head):-len(loc.LINK_SUFFIX)]
                if not digits.isascii() or int(digits) in links:
                    raise _Leave
                if entry.is_symlink():
                    try:
                        target = os.readlink(n, dir_fd=profiles)
                        mtime = entry.stat(follow_symlinks=False).st_mtime
                    except FileNotFoundError:
                        continue  # deleted meanwhile
                    links[int(digits)] = (target.rpartition("/")[2], mtime)
    return links, sorted(numbers)


def _summarised(var: int, profiles: int, profile: str, numbers: list[int]) -> dict[int, dict] | None:
    """records.summarised when every record's entry in the summary is current: number -> its
    entry; None when one is not (the full function reads and checks that record)."""
    if not numbers:
        return {}
    from llmgw_store.core import proofs
    from llmgw_store.roots import summary

    key = proofs.secret(var)
    if key is None:
        return None
    known = summary.read(profiles, profile, key)
    if known is None:
        return None
    out = {}
    for n in numbers:
        entry = known.get(n)
        if entry is None or summary.record_stamp(profiles, f".{profile}-{n}.record") != entry["stamp"]:
            return None
        out[n] = entry  # its _SHOWN fields (summary.read checked they are there) and its stamp
    return out


def _held(root: str, profile: str) -> bool:
    """Whether holds/<profile> may be a hold (the full function reads it); False when it is absent."""
    try:
        os.lstat(f"{root}/holds/{profile}")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


def _utc(mtime: float) -> str:
    """profiles._time_of: datetime.fromtimestamp(mtime, UTC) (its microseconds rounded half to
    even, a carry into the second) as %Y-%m-%dT%H:%M:%SZ, without datetime."""
    if mtime < 0:
        raise _Leave
    seconds = int(mtime)
    if round((mtime - seconds) * 1e6) >= 1_000_000:
        seconds += 1
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _comes_from(rec: dict | None, substituters: tuple[str, ...], substitute_only: bool) -> str:
    """profiles.comes_from for a summary entry."""
    if rec is None:
        return "nowhere"
    if substituters:
        return "caches" if substitute_only or not rec["rebuildable"] else "caches, else record"
    return "record" if rec["rebuildable"] and not substitute_only else "nowhere"


def _history(profiles: int, profile: str) -> list[dict] | None:
    """records.history(layout, profile, last=50), for a history that is a plain file of ours closed
    to others (None otherwise: the full function tightens or refuses it, and says so), each line
    one the C codec reads as json.loads reads it (None for one it might read otherwise)."""
    try:
        raw = files.read_bounded(f".{profile}.history", HISTORY_MAX_BYTES, dir_fd=profiles, owner=os.geteuid(),
                                 deny_mode=0o077, one_link=True)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    events = []
    for line in raw.split(b"\n")[-(HISTORY_LAST + 1):]:
        try:
            event = jsontext.loads(line)
        except ValueError:
            if b"\0" in line or line.startswith(b"\xef\xbb\xbf"):
                return None  # json.loads would guess another encoding, or take the BOM
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return None  # json.loads decodes with surrogatepass
            continue
        if isinstance(event, dict) and len(event) <= 16:
            events.append(event)
    return events[-HISTORY_LAST:]
