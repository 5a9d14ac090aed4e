"""Compiling an environment's bytecode before it is frozen.

The tree is read-only once in the store, so an engine started from it could never write its
bytecode cache: it is compiled here, by the environment's own interpreter, in one worker per core.
Two choices differ from `uv pip install --compile-bytecode`:
- the source path recorded in each pyc is relative to the environment (Python puts the real path
  back when it imports the module), so the bytes do not depend on where the tree was built — not
  on the `.partial` name, not on the store root;
- pycs are `unchecked-hash`: the store never changes a source, so Python need not stat it on import,
  and the bytes do not depend on file times.
Together: identical sources give identical pycs in every environment, so a rebuild is byte-identical
and `optimise` can share pycs across environments. It was also faster than uv's compiler here
(5.0 s against 5.4 s for a 200 MB environment of 2,642 modules on 2 cores).

Because the bytes depend only on the source, the interpreter's magic number, the invalidation mode,
the optimisation level and the recorded relative path, compiled files are kept in a store-wide
cache, `ROOT/cache/pyc/<magic>/<k[:2]>/<k>.<tag>.pyc`, where k is the sha256 of all of those and
the tag is HMAC-SHA256 of k and the pyc's bytes under the store's secret (`ROOT/var/pyc-cache.key`,
32 random bytes, 0600 in the 0700 var/). (Compiling is most of a vLLM build: 80 of 120 s for its 98,000 files here.)

Invariants that keep one environment from poisoning another through this cache:
- a build never links a cache entry into its environment: an entry is reused by reading it and
  writing a new file into the environment (which registration may then share with the store's
  identical, verified copy: core/dedupe.py). The other way is taken once the environment is
  registered (link_cache): each entry the build used or made becomes a link to the environment's
  own pyc, a store inode (frozen, the store user's, no write bit), in place of the entry's copy, so
  the bytecode is on disk once. Only a store inode is ever linked into the cache, never a cache
  file into the store. An edit in place to that inode (chmod u+w and write, as root can) is an
  edit to a store path, which `verify` names; the cache entry then fails its check below and is
  deleted, so it reaches no later build;
- nothing of the cache's changes a store inode: a reuse marks only an entry with one link (its own
  copy) as used (its mtime), and gc's pruning only unlinks (roots/gc.py: an entry a store path
  links is kept while one does);
- an entry is used only if its tag is right for its key and bytes; one that is not is deleted and
  the module compiled again. So a damaged entry is never used, and neither is one planted by
  someone who can write the cache but not read the secret: the tag binds the bytes to the source
  they were compiled from, which a plain hash of the bytes would not. The secret reaches the
  compile script in its environment (readable only by the store's user), never on a command line. Entries are made by writing a temporary file and renaming it to
  its final name (atomic in one directory), so a reader sees a complete entry or none;
- nothing under the cache is followed if it is a symlink (every open is O_NOFOLLOW, relative to a
  directory descriptor), and only names matching ENTRY are read, at most MAX_ENTRIES_PER_KEY per key.
A reuse sets the mtime of an entry that is its own copy: gc drops those no build has used for a
while (gc.py).

The script runs as a child of procs.run, so it and its pool workers are in one process group that
the store's keeper kills when the build ends or dies. The workers also set PR_SET_PDEATHSIG
(SIGKILL) in the pool's initializer, so they die with the script even if it alone is killed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

# The names gc and the compiler agree on: `<key>.<sha256 of the bytes>.pyc`.
ENTRY_RE = re.compile(r"([0-9a-f]{64})\.([0-9a-f]{64})\.pyc")
TEMP_PREFIX = ".tmp-"
SECRET_ENV = "LLMGW_STORE_PYC_SECRET"
SECRET_BYTES = 32
# Modules per pool worker, at least: a pool costs its fork, multiprocessing's import and each
# worker's start (0.3-0.6 s on a loaded 2-core node), against about 3 ms a module, so a smaller
# tree is compiled in the script itself (black's 88 modules: 0.27-0.49 s serial, 0.74-1.12 s in a
# pool of 2). Below 2 * 200 modules one worker, so the pool's start-up is paid only where it gains.
MODULES_PER_WORKER = 200


def workers(modules: int) -> int:
    """How many processes compile a tree of `modules` modules (the script's choice, for the bench)."""
    return max(1, min(len(os.sched_getaffinity(0)) or 1, modules // MODULES_PER_WORKER or 1))

SCRIPT = r"""
import hashlib, hmac, importlib.util, os, re, signal, stat, sys, py_compile

def die_with(parent):
    # Pool initializer: a worker dies with this script (PR_SET_PDEATHSIG, SIGKILL), even if the
    # script is killed alone; the store's keeper kills the whole process group in any case.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    if os.getppid() != parent:  # the script died before prctl took effect
        os._exit(1)

ENTRY = re.compile(%(entry)r)
TEMP = %(temp)r
MODE = py_compile.PycInvalidationMode.UNCHECKED_HASH
OPTIMIZE = 0
SALT = b"llmgw-pyc\0" + importlib.util.MAGIC_NUMBER + b"\0unchecked-hash\0optimize=0\0"
SECRET = bytes.fromhex(os.environ.get(%(secret_env)r, ""))  # without it the cache is not used

def tag(key, data):
    return hmac.new(SECRET, key.encode() + b"\0" + data, "sha256").hexdigest()
MAX_PYC = 64 << 20          # no pyc of a real module comes near this; larger entries are ignored
MAX_SHARD_NAMES = 1 << 20   # names read from one cache directory
MAX_ENTRIES_PER_KEY = 4     # entries of one key tried before compiling
PROGRESS_EVERY = 64         # modules between two progress lines of a worker
DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW

def opendir(name, parent_fd, create):
    if create:
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass
    return os.open(name, DIR, dir_fd=parent_fd)

class Cache:
    # One per worker: each shard directory is opened and listed once, lazily.
    def __init__(self, path):
        self.fd = None
        self.shards = {}
        self.n = 0
        if len(SECRET) < 32:
            return  # no secret, no cache: every module is compiled
        try:
            top = os.open(path, DIR)
            try:
                self.fd = opendir(importlib.util.MAGIC_NUMBER.hex(), top, True)
            finally:
                os.close(top)
        except OSError:
            pass  # no cache: every module is compiled

    def shard(self, key):
        s = key[:2]
        if s not in self.shards:
            fd, names = None, {}
            try:
                fd = opendir(s, self.fd, True)
                with os.scandir(fd) as it:
                    for i, e in enumerate(it):
                        if i >= MAX_SHARD_NAMES:
                            break
                        m = ENTRY.fullmatch(e.name)
                        if m:
                            names.setdefault(m.group(1), []).append(e.name)
            except OSError:
                fd, names = None, {}
            self.shards[s] = (fd, names)
        return self.shards[s]

    def get(self, key):
        # (bytes, name) of a verified entry for `key`, or None. A damaged entry is deleted.
        if self.fd is None:
            return None
        fd, names = self.shard(key)
        for name in names.get(key, [])[:MAX_ENTRIES_PER_KEY]:
            data, links = read_regular(name, fd)
            if data is None:
                continue
            if hmac.compare_digest(tag(key, data), name[65:129]):
                if links == 1:  # never the times of a store inode (link_cache made it the entry)
                    try:
                        os.utime(name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        pass
                return data, name
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
        return None

    def put(self, key, data):
        # The entry's name once it is in the cache, else None.
        if self.fd is None:
            return None
        fd, names = self.shard(key)
        if fd is None:
            return None
        name = key + "." + tag(key, data) + ".pyc"
        if name in names.get(key, ()):
            return name
        self.n += 1
        tmp = TEMP + str(os.getpid()) + "-" + str(self.n)
        try:
            write_new(tmp, fd, data, 0o444)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            return None
        return name

def read_regular(name, dir_fd):
    # (bytes, link count) of a regular file, or (None, 0).
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None, 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_PYC:
            return None, 0
        chunks, left = [], st.st_size + 1
        while left > 0:
            b = os.read(fd, left)
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks), st.st_nlink
    except OSError:
        return None, 0
    finally:
        os.close(fd)

def write_new(name, dir_fd, data, mode):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)

def place(target, data):
    # A new inode in the environment; rename over whatever is there (never written through).
    d = os.path.dirname(target)
    os.makedirs(d, exist_ok=True)
    dfd = os.open(d, DIR)
    tmp = TEMP + str(os.getpid()) + "-" + os.path.basename(target)
    try:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        write_new(tmp, dfd, data, 0o644)
        os.rename(tmp, os.path.basename(target), src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)

CACHE = None

def work(args):
    root, cache_dir, chunk = args
    pause = os.environ.get("LLMGW_STORE_DEBUG_COMPILE_PAUSE")  # a test hook, as debug.pause does
    if pause:
        import time
        if pause.startswith("wait:"):
            base = os.path.join(pause[5:], "compile_pause")
            with open("%%s.reached.%%d" %% (base, os.getpid()), "w") as f:
                f.write(str(os.getpid()))
            os.link("%%s.reached.%%d" %% (base, os.getpid()), "%%s.pid-%%d" %% (base, os.getpid()))
            os.replace("%%s.reached.%%d" %% (base, os.getpid()), base + ".reached")
            deadline = time.monotonic() + 300
            while not os.path.exists(base + ".go") and time.monotonic() < deadline:
                time.sleep(0.005)
        else:
            time.sleep(float(pause))
    global CACHE
    if CACHE is None:
        CACHE = Cache(cache_dir)  # one per process: its shard listings serve every chunk
    cache = CACHE
    failed = reused = 0
    used = []  # (entry, target) of each entry this chunk reused or made: link_cache's list
    magic = importlib.util.MAGIC_NUMBER.hex()
    for n, src in enumerate(chunk, 1):
        if n %% PROGRESS_EVERY == 0:  # progress, read by the store (procs.Heartbeat)
            os.write(1, b"llmgw-progress: +%%d\n" %% PROGRESS_EVERY)
        rel = os.path.relpath(src, root)
        try:
            with open(src, "rb") as f:
                data = f.read()
        except OSError:
            failed += 1
            continue
        key = hashlib.sha256(SALT + rel.encode() + b"\0" + data).hexdigest()
        target = importlib.util.cache_from_source(src)
        cached = cache.get(key)
        if cached is not None:
            place(target, cached[0])
            used.append(magic + "/" + key[:2] + "/" + cached[1] + "\t" + os.path.relpath(target, root))
            reused += 1
            continue
        try:
            py_compile.compile(src, cfile=target, dfile=rel, doraise=True, optimize=OPTIMIZE,
                               invalidation_mode=MODE)
        except (py_compile.PyCompileError, SyntaxError, ValueError, UnicodeDecodeError):
            failed += 1  # like compileall and uv: a module that does not compile is left as source
            continue
        with open(target, "rb") as f:
            made = cache.put(key, f.read())
        if made is not None:
            used.append(magic + "/" + key[:2] + "/" + made + "\t" + os.path.relpath(target, root))
    os.write(1, b"llmgw-progress: +%%d\n" %% (len(chunk) %% PROGRESS_EVERY))
    return failed, reused, used

if __name__ == "__main__":
    root, lib, cache = sys.argv[1], sys.argv[2], sys.argv[3]
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(lib) for f in fs if f.endswith(".py"))
    n = max(1, min(len(os.sched_getaffinity(0)) or 1, len(files) // %(per_worker)d or 1))
    print("llmgw-progress: total %%d modules" %% len(files), flush=True)
    if n == 1 and not os.environ.get("LLMGW_STORE_DEBUG_COMPILE_PAUSE"):
        # A small tree: compiled here; a pool (multiprocessing's import, a fork) would cost more.
        # (The pause hook is for tests of the pool's workers dying with the script: it keeps one.)
        results = [work((root, cache, files))]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # fork, whatever the interpreter's default: the pool then forks every worker up front, from
        # this main thread, before it starts a thread of its own; the main thread lives as long as
        # the script, so the workers' PDEATHSIG fires when the script dies, not before.
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"),
                                 initializer=die_with, initargs=(os.getpid(),)) as pool:
            # Several chunks per worker, so one that drew the slow modules does not finish alone.
            size = max(25, len(files) // (n * 8))
            results = list(pool.map(work, [(root, cache, files[i:i + size]) for i in range(0, len(files), size)]))
    if len(sys.argv) > 4:  # the entries used, for link_cache once the environment is in the store
        with open(sys.argv[4], "w") as f:
            f.writelines(line + "\n" for r in results for line in r[2])
    print(len(files), sum(r[0] for r in results), sum(r[1] for r in results))
""" % {"entry": ENTRY_RE.pattern, "temp": TEMP_PREFIX, "secret_env": SECRET_ENV, "per_worker": MODULES_PER_WORKER}  # noqa: UP031 (the script has braces of its own)


def cache_secret(path: Path) -> bytes:
    """The store's secret that tags bytecode cache entries: 32 random bytes in `path`, made on first
    use (system/files.private_secret: 0600, whole or absent, never through a link). A file that is
    not the store user's own private 32-byte regular file with one link is refused: the cache is
    then not used (a fresh random secret is returned, so every entry fails its check and nothing
    planted is read)."""
    from llmgw_store.system.files import private_secret

    try:
        return private_secret(path, SECRET_BYTES)
    except OSError:  # refused (FileRefused is an OSError), or it cannot be made
        return os.urandom(SECRET_BYTES)


def compile_tree(python: Path, env: Path, cache: Path, run, links: Path | None = None) -> tuple[int, int, int]:
    """(modules, modules that failed to compile, modules reused from the cache) for `env/lib`,
    using `run(argv, what)`. With `links`, the entries used or made are listed there, one
    `<magic>/<shard>/<entry>\t<pyc relative to env>` a line, for link_cache."""
    out = run([python, "-c", SCRIPT, env, env / "lib", cache, *([links] if links is not None else [])],
              "compiling bytecode")
    total, failed, reused = out.split()[-3:]
    return int(total), int(failed), int(reused)


_LINK_LINE = re.compile(r"([0-9a-f]{8})/([0-9a-f]{2})/(([0-9a-f]{64})\.[0-9a-f]{64}\.pyc)\t((?:[^/\0\t\n]+/){1,64}[^/\0\t\n]+\.pyc)")
LINKS_MAX = 64 << 20  # the list's bytes read at most: a line per module, far from this
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def links_file(tmp: Path, key: str) -> Path:
    """Where a build of `key` lists the cache entries it used (compile_tree's `links`)."""
    return tmp / f"pyc-links-{key}-{os.getpid()}"


def link_cache(cache: Path, env: Path, links: Path) -> int:
    """Make each cache entry `links` names a link to the registered environment `env`'s own pyc (a
    store inode) in place of its copy, so the bytecode is on disk once; returns how many. `links`
    comes from the compile script, which ran the environment's interpreter: every line is matched
    with re.fullmatch, every directory opened O_NOFOLLOW, and a file is linked only if it is a
    store inode (the store user's, no write bit) of the size of the entry it replaces. A wrong line
    can at worst put bytes under a name their tag does not match: the next build's check deletes
    that entry and compiles the module. Entries that are gone are not made again."""
    from llmgw_store.system.files import read_bounded

    try:
        data = read_bounded(links, LINKS_MAX)
    except OSError:
        return 0
    linked = 0
    dirs: dict[tuple[str, str], int] = {}  # ("env"|"cache", relative directory) -> descriptor
    euid = os.geteuid()

    def opendir(side: str, rel: str) -> int:
        if (side, rel) not in dirs:
            parent, _, name = rel.rpartition("/")
            top = os.fspath(env if side == "env" else cache)
            dirs[(side, rel)] = os.open(name, _DIR, dir_fd=opendir(side, parent)) if rel else os.open(top, _DIR)
        return dirs[(side, rel)]

    try:
        for line in data.decode(errors="replace").split("\n")[:1 << 22]:
            m = _LINK_LINE.fullmatch(line)
            if m is None or m.group(2) != m.group(4)[:2] or ".." in m.group(5).split("/"):
                continue
            magic, shard, name, _, rel = m.groups()
            try:
                linked += _link_one(opendir("cache", f"{magic}/{shard}"), name,
                                    opendir("env", rel.rpartition("/")[0]), rel.rpartition("/")[2], euid)
            except OSError:
                continue
    finally:
        for fd in dirs.values():
            os.close(fd)
    return linked


def _link_one(shard_fd: int, name: str, env_dir: int, pyc: str, euid: int) -> int:
    fd = os.open(pyc, _FILE, dir_fd=env_dir)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != euid or st.st_mode & 0o7222:
            return 0  # not a frozen store file of the store's user: never linked into the cache
        old = os.lstat(name, dir_fd=shard_fd)
        if not stat.S_ISREG(old.st_mode) or old.st_size != st.st_size or (old.st_dev, old.st_ino) == (st.st_dev, st.st_ino):
            return 0
        tmp = f"{TEMP_PREFIX}link-{os.getpid()}-{name[:16]}"
        # the very inode open as `fd`, through /proc/self/fd (linkat AT_SYMLINK_FOLLOW): not
        # whatever a name holds by the time of the link
        os.link(f"/proc/self/fd/{fd}", tmp, dst_dir_fd=shard_fd, follow_symlinks=True)
        try:
            os.rename(tmp, name, src_dir_fd=shard_fd, dst_dir_fd=shard_fd)
        except BaseException:
            os.unlink(tmp, dir_fd=shard_fd)
            raise
        return 1
    finally:
        os.close(fd)
