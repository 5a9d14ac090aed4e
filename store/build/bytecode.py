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
  copy) as used (its mtime), and gc's pruning only unlinks (roots/cacheprune.py: an entry a store path
  links is kept while one does);
- an entry is used only if its tag is right for its key and bytes; one that is not is deleted and
  the module compiled again. So a damaged entry is never used, and neither is one planted by
  someone who can write the cache but not read the secret: the tag binds the bytes to the source
  they were compiled from, which a plain hash of the bytes would not. The secret reaches the
  compile script in its environment (readable only by the store's user), never on a command line;
  the script runs with -I -S, so no `.pth` file a wheel installs runs beside it (`site` would run
  one at the interpreter's start). Entries are made by writing a temporary file and renaming it to
  its final name (atomic in one directory), so a reader sees a complete entry or none;
- nothing under the cache is followed if it is a symlink (every open is O_NOFOLLOW, relative to a
  directory descriptor), and only names matching ENTRY are read, at most MAX_ENTRIES_PER_KEY per key.
A reuse sets the mtime of an entry that is its own copy: gc drops those no build has used for a
while (roots/cacheprune.py).

The compiler (build/bytecode_worker.py, run by its path with -I -S) runs as a child of procs.run,
so it and its pool workers are in one process group that the store's keeper kills when the build
ends or dies. The workers also set PR_SET_PDEATHSIG
(SIGKILL) in the pool's initializer, so they die with the script even if it alone is killed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from llmgw_store.build import bytecode_worker

# The names gc and the compiler agree on: `<key>.<sha256 of the bytes>.pyc`.
ENTRY_RE = bytecode_worker.ENTRY
TEMP_PREFIX = bytecode_worker.TEMP
SECRET_ENV = bytecode_worker.SECRET_ENV
SECRET_BYTES = 32
MODULES_PER_WORKER = bytecode_worker.MODULES_PER_WORKER  # the worker's rule for its pool (and the bench's)
# The compiler is a real module run as a script by the environment's interpreter with -I -S
# (build/bytecode_worker.py), as procs.KEEPER is: never imported there.
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bytecode_worker.py")


workers = bytecode_worker.workers  # how many processes compile a tree of n modules (for the bench)


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
    out = run([python, "-I", "-S", WORKER, env, env / "lib", cache, *([links] if links is not None else [])],
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
