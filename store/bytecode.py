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

Because the bytes depend only on the source, the interpreter's magic number and the recorded
relative path, compiled files are kept in a store-wide cache, `ROOT/cache/pyc/<magic>/`, named by
sha256 of (source bytes, relative path), and hardlinked into each environment: a second environment
with mostly the same packages compiles only what is new, and shares those pycs on disk. (Compiling
is most of a vLLM build: 80 of 120 s for its 98,000 files here.) The key is the content, never an
inode or a time, so a stale entry cannot stand in for a changed source. gc deletes entries no
environment links any more.

The script runs as a child of procs.run, so it and its pool workers are in one process group that
the store's keeper kills when the build ends or dies. The workers also set PR_SET_PDEATHSIG
(SIGKILL) in the pool's initializer, so they die with the script even if it alone is killed.
"""

from __future__ import annotations

from pathlib import Path

SCRIPT = r"""
import hashlib, importlib.util, multiprocessing, os, signal, sys, py_compile
from concurrent.futures import ProcessPoolExecutor

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

def reuse(cached, target):
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.link(cached, target)
        return True
    except FileExistsError:
        os.unlink(target)
        return reuse(cached, target)
    except OSError:  # gone meanwhile (gc), or another filesystem: compile instead
        return False

def work(args):
    root, cache, chunk = args
    pause = os.environ.get("LLMGW_STORE_DEBUG_COMPILE_PAUSE")  # a test hook, see debug.py
    if pause:
        import time
        time.sleep(float(pause))
    failed = reused = 0
    for src in chunk:
        rel = os.path.relpath(src, root)
        try:
            with open(src, "rb") as f:
                data = f.read()
        except OSError:
            failed += 1
            continue
        key = hashlib.sha256(data + b"\0" + rel.encode()).hexdigest()
        cached = os.path.join(cache, key[:2], key + ".pyc")
        target = importlib.util.cache_from_source(src)
        if os.path.exists(cached) and reuse(cached, target):
            reused += 1
            continue
        try:
            py_compile.compile(src, cfile=target, dfile=rel, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        except (py_compile.PyCompileError, SyntaxError, ValueError, UnicodeDecodeError):
            failed += 1  # like compileall and uv: a module that does not compile is left as source
            continue
        try:
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            os.link(target, cached)
        except OSError:
            pass  # another build cached the same file first
    return failed, reused

if __name__ == "__main__":
    root, lib, cache = sys.argv[1], sys.argv[2], sys.argv[3]
    cache = os.path.join(cache, importlib.util.MAGIC_NUMBER.hex())
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(lib) for f in fs if f.endswith(".py"))
    n = max(1, min(os.cpu_count() or 1, len(files) // 50 or 1))
    # fork, whatever the interpreter's default: the pool then forks every worker up front, from
    # this main thread, before it starts a thread of its own; the main thread lives as long as
    # the script, so the workers' PDEATHSIG fires when the script dies, not before.
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"),
                             initializer=die_with, initargs=(os.getpid(),)) as pool:
        results = list(pool.map(work, [(root, cache, files[i::n]) for i in range(n)]))
    print(len(files), sum(r[0] for r in results), sum(r[1] for r in results))
"""


def compile_tree(python: Path, env: Path, cache: Path, run) -> tuple[int, int, int]:
    """(modules, modules that failed to compile, modules reused from the cache) for `env/lib`,
    using `run(argv, what)`."""
    out = run([python, "-c", SCRIPT, env, env / "lib", cache], "compiling bytecode")
    total, failed, reused = out.split()[-3:]
    return int(total), int(failed), int(reused)
