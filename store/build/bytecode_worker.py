"""The bytecode compiler: run in the environment's own interpreter, never imported there.

`python -I -S bytecode_worker.py ENV LIB CACHE [LINKS]` compiles every module under LIB
(build/bytecode.py says how and why: relative source paths, unchecked-hash pycs, the tagged
store-wide cache at CACHE). It runs by its file path, isolated (-I: no PYTHON* variable, no user
site, not its own directory on sys.path) and without `site` (-S: not the environment's
site-packages), so nothing the environment installs is imported into it; it imports the standard
library only, and must run on every Python an environment may have. The store imports it only for
the constants both sides agree on (ENTRY, TEMP, SECRET_ENV, MODULES_PER_WORKER).

Output: `llmgw-progress:` lines (read by procs.Heartbeat), then `<modules> <failed> <reused>`;
with LINKS, the cache entries used or made, one `<magic>/<shard>/<entry>\\t<pyc relative to ENV>`
a line, for bytecode.link_cache. The secret that tags cache entries comes in SECRET_ENV (hex), never
on the command line; without it the cache is not used.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import os
import py_compile
import re
import signal
import stat
import sys

# The names gc and the compiler agree on: `<key>.<sha256 of the bytes>.pyc`.
ENTRY = re.compile(r"([0-9a-f]{64})\.([0-9a-f]{64})\.pyc")
TEMP = ".tmp-"
SECRET_ENV = "LLMGW_STORE_PYC_SECRET"
# Modules per pool worker, at least: a pool costs its fork, multiprocessing's import and each
# worker's start (0.3-0.6 s on a loaded 2-core node), against about 3 ms a module, so a smaller
# tree is compiled in the script itself (black's 88 modules: 0.27-0.49 s serial, 0.74-1.12 s in a
# pool of 2). Below 2 * 200 modules one worker, so the pool's start-up is paid only where it gains.
MODULES_PER_WORKER = 200

MODE = py_compile.PycInvalidationMode.UNCHECKED_HASH
OPTIMIZE = 0
SALT = b"llmgw-pyc\0" + importlib.util.MAGIC_NUMBER + b"\0unchecked-hash\0optimize=0\0"
MAX_PYC = 64 << 20          # no pyc of a real module comes near this; larger entries are ignored
MAX_SHARD_NAMES = 1 << 20   # names read from one cache directory
MAX_ENTRIES_PER_KEY = 4     # entries of one key tried before compiling
PROGRESS_EVERY = 64         # modules between two progress lines of a worker
DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def workers(modules: int) -> int:
    """How many processes compile a tree of `modules` modules."""
    return max(1, min(len(os.sched_getaffinity(0)) or 1, modules // MODULES_PER_WORKER or 1))


def die_with(parent: int) -> None:
    # Pool initializer: a worker dies with this script (PR_SET_PDEATHSIG, SIGKILL), even if the
    # script is killed alone; the store's keeper kills the whole process group in any case.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    if os.getppid() != parent:  # the script died before prctl took effect
        os._exit(1)


def opendir(name: str, parent_fd: int, create: bool) -> int:
    if create:
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass
    return os.open(name, DIR, dir_fd=parent_fd)


class Cache:
    # One per worker: each shard directory is opened and listed once, lazily.
    def __init__(self, path: str) -> None:
        self.fd: int | None = None
        self.shards: dict[str, tuple[int | None, dict[str, list[str]]]] = {}
        self.n = 0
        self.secret = bytes.fromhex(os.environ.get(SECRET_ENV, ""))  # without it the cache is not used
        if len(self.secret) < 32:
            return  # no secret, no cache: every module is compiled
        try:
            top = os.open(path, DIR)
            try:
                self.fd = opendir(importlib.util.MAGIC_NUMBER.hex(), top, True)
            finally:
                os.close(top)
        except OSError:
            pass  # no cache: every module is compiled

    def tag(self, key: str, data: bytes) -> str:
        return hmac.new(self.secret, key.encode() + b"\0" + data, "sha256").hexdigest()

    def shard(self, key: str) -> tuple[int | None, dict[str, list[str]]]:
        s, top = key[:2], self.fd
        if top is None:  # no cache (get and put ask only with one)
            return None, {}
        if s not in self.shards:
            fd: int | None = None
            names: dict[str, list[str]] = {}
            try:
                fd = opendir(s, top, True)
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

    def get(self, key: str) -> tuple[bytes, str] | None:
        # (bytes, name) of a verified entry for `key`, or None. A damaged entry is deleted.
        if self.fd is None:
            return None
        fd, names = self.shard(key)
        for name in names.get(key, [])[:MAX_ENTRIES_PER_KEY]:
            data, links = read_regular(name, fd)
            if data is None:
                continue
            if hmac.compare_digest(self.tag(key, data), name[65:129]):
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

    def put(self, key: str, data: bytes) -> str | None:
        # The entry's name once it is in the cache, else None.
        if self.fd is None:
            return None
        fd, names = self.shard(key)
        if fd is None:
            return None
        name = key + "." + self.tag(key, data) + ".pyc"
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


def read_regular(name: str, dir_fd: int | None) -> tuple[bytes | None, int]:
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


def write_new(name: str, dir_fd: int, data: bytes, mode: int) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def place(target: str, data: bytes) -> None:
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


CACHE: Cache | None = None


def debug_pause(pause: str) -> None:
    # A test hook, as app/debug.pause does (LLMGW_STORE_DEBUG_COMPILE_PAUSE): `wait:<dir>` holds
    # each worker before its first file until <dir>/compile_pause.go exists (at most 300 s).
    import time
    if pause.startswith("wait:"):
        base = os.path.join(pause[5:], "compile_pause")
        with open(f"{base}.reached.{os.getpid()}", "w") as f:
            f.write(str(os.getpid()))
        os.link(f"{base}.reached.{os.getpid()}", f"{base}.pid-{os.getpid()}")
        os.replace(f"{base}.reached.{os.getpid()}", base + ".reached")
        deadline = time.monotonic() + 300
        while not os.path.exists(base + ".go") and time.monotonic() < deadline:
            time.sleep(0.005)
    else:
        time.sleep(float(pause))


def work(args: tuple[str, str, list[str]]) -> tuple[int, int, list[str]]:
    root, cache_dir, chunk = args
    pause = os.environ.get("LLMGW_STORE_DEBUG_COMPILE_PAUSE")
    if pause:
        debug_pause(pause)
    global CACHE
    if CACHE is None:
        CACHE = Cache(cache_dir)  # one per process: its shard listings serve every chunk
    cache = CACHE
    failed = reused = 0
    used = []  # (entry, target) of each entry this chunk reused or made: link_cache's list
    magic = importlib.util.MAGIC_NUMBER.hex()
    for n, src in enumerate(chunk, 1):
        if n % PROGRESS_EVERY == 0:  # progress, read by the store (procs.Heartbeat)
            os.write(1, b"llmgw-progress: +%d\n" % PROGRESS_EVERY)
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
    os.write(1, b"llmgw-progress: +%d\n" % (len(chunk) % PROGRESS_EVERY))
    return failed, reused, used


def main(argv: list[str]) -> None:
    root, lib, cache = argv[1], argv[2], argv[3]
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(lib) for f in fs if f.endswith(".py"))
    n = workers(len(files))
    print(f"llmgw-progress: total {len(files)} modules", flush=True)
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
    if len(argv) > 4:  # the entries used, for link_cache once the environment is in the store
        with open(argv[4], "w") as f:
            f.writelines(line + "\n" for r in results for line in r[2])
    print(len(files), sum(r[0] for r in results), sum(r[1] for r in results))


if __name__ == "__main__":
    main(sys.argv)
