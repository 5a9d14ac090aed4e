"""Benchmark verify and registration-time sharing against their baselines, side by side
(bench/harness.py: alternating fresh processes, medians, median of per-round ratios, load, peak
RSS of the command alone, CPU seconds with every child).

(a) verify: the whole `llmgw-store verify PATH` command (start-up, imports, the index, the listing,
    the walk and every byte hashed) against `b3sum --num-threads T` over the same files (T = the
    threads verify hashes with, `manifest.THREADS`; Debian's `b3sum`, BLAKE3's reference CLI;
    without it a blake3 pass in a fresh `python -c`, and the document says so). Page cache warm
    for both (one untimed run each). Ratio = verify's time / b3sum's (issue 25: verify at >= 0.95x
    b3sum's speed, i.e. a ratio <= 1.05). Peak RSS counts the page-cache pages of the files each
    maps (both mmap large files): resident pages, not memory allocated.
    The environment is a real build (issue 33: what a user verifies): bench/recipes/transformers.toml
    from PyPI (~190 MiB in ~6,800 files; --recipe another), --quick black's stand-in from the
    loopback index (bench/common.black_standin). --tree-mb N generates a tree instead (N MB in
    many small .py/.pyc files and a few large .so-like ones) registered as a store path; --root ROOT
    --name NAME measures a path of an existing store.
(b) sharing at registration: two neighbouring versions of a package set (two recipes that differ in
    one dependency) built from a loopback index of generated wheels (a large shared "engine" wheel
    with .so-like files and many modules, and a small dependency that differs): the second path's
    added disk (du of store/, each inode once, after minus before) against its own size (issue 25:
    <= 15 %).

    python bench/bench_integrity.py [--rounds 5] [--out DIR]     # full run (needs PyPI for transformers)
    python bench/bench_integrity.py --quick --out DIR                            # what the test suite runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, REPO, cli, packages, store_json, uv_bin
from harness import Bench, BenchError, Side, add_common_args, du_bytes

# The baseline: what a bare blake3 pass over a tree costs in a fresh process. argv: tree, threads
# (1 = one thread, N = a pool of N over the files, with blake3's own threads for the big ones).
BASELINE = r"""
import os, sys, stat
from concurrent.futures import ThreadPoolExecutor
from blake3 import blake3
root, threads = sys.argv[1], int(sys.argv[2])
files = []
def walk(d):
    with os.scandir(d) as it:
        for e in sorted(it, key=lambda e: e.name):
            if e.is_dir(follow_symlinks=False):
                walk(e.path)
            elif e.is_file(follow_symlinks=False):
                files.append((e.path, e.stat(follow_symlinks=False).st_size))
walk(root)
def one(p):
    path, size = p
    if size >= 1 << 22:
        h = blake3(max_threads=blake3.AUTO if threads > 1 else 1)
        h.update_mmap(path)
        return h.hexdigest()
    with open(path, "rb") as f:
        return blake3(f.read()).hexdigest()
if threads == 1:
    out = [one(p) for p in files]
else:
    with ThreadPoolExecutor(threads) as pool:
        out = list(pool.map(one, files))
print(len(out), sum(s for _, s in files))
"""


def generate_tree(dest: Path, total_mb: int, seed: int = 17) -> tuple[int, int]:
    """A tree shaped like a data-science environment (442 MB in 12,621 files): 40% of the bytes in
    small files (.py sources of a median 10 KB, their .pyc, dist-info files), the rest in large
    .so-like files of 1-60 MB. Returns (files, bytes)."""
    rnd = random.Random(seed)
    total = total_mb << 20
    small_budget = int(total * 0.40)
    big_budget = total - small_budget
    files = nbytes = 0
    blob = os.urandom(min(64 << 20, max(total, 1 << 20)))  # slices of this: generation should not dominate

    def write(p: Path, size: int, mode: int = 0o644) -> None:
        nonlocal files, nbytes
        p.parent.mkdir(parents=True, exist_ok=True)
        off = rnd.randrange(0, len(blob) - min(size, len(blob)) + 1)
        with open(p, "wb") as f:
            left = size
            while left:
                n = min(left, len(blob) - off)
                f.write(blob[off:off + n])
                left -= n
                off = 0
        os.chmod(p, mode)
        files += 1
        nbytes += size

    site = dest / "lib" / "python3.11" / "site-packages"
    pkg = 0
    while small_budget > 0:
        pdir = site / f"pkg{pkg:03d}"
        for m in range(rnd.randrange(20, 200)):
            size = int(min(200_000, rnd.lognormvariate(9.25, 1.0)))  # median ~10 KB
            sub = pdir / f"sub{m % 7}"
            write(sub / f"mod{m}.py", size)
            write(sub / "__pycache__" / f"mod{m}.cpython-311.pyc", int(size * 0.8))
            small_budget -= int(size * 1.8)
        write(site / f"pkg{pkg:03d}-1.0.dist-info" / "RECORD", rnd.randrange(2000, 20000))
        write(site / f"pkg{pkg:03d}-1.0.dist-info" / "METADATA", rnd.randrange(500, 5000))
        pkg += 1
    i = 0
    while big_budget > 0:
        size = min(big_budget, rnd.randrange(1 << 20, 60 << 20))
        write(site / f"pkg{i % max(pkg, 1):03d}" / f"_native{i}.cpython-311-x86_64-linux-gnu.so", size, 0o755)
        big_budget -= size
        i += 1
    (dest / "bin").mkdir(exist_ok=True)
    os.symlink("/usr/bin/python3", dest / "bin" / "python")
    return files, nbytes


def register_tree(root: Path, tree_mb: int) -> str:
    """Generate a tree as a store path (frozen, listed, with a manifest) and register it."""
    from llmgw_store.core import manifest
    from llmgw_store.core.index import now_iso
    from llmgw_store.core.keys import store_key
    from llmgw_store.core.local_store import Store
    from llmgw_store.core.pathinfo import StorePathInfo
    from llmgw_store.system.trees import freeze

    with Store.open(root, create=True) as store:
        inputs = {"bench": "integrity", "mb": tree_mb}
        key = store_key(inputs)  # verify checks the manifest's inputs hash to the key
        name = f"{key}-benchtree-1.0-cpu"
        env = store.layout.path_of(name)
        if env.exists():
            return name
        partial = store.layout.partial_of(name)
        generate_tree(partial, tree_mb)
        (partial / manifest.MANIFEST_DIR).mkdir()
        freeze(partial, keep_writable=partial / manifest.MANIFEST_DIR)
        entries = manifest.scan(partial)
        manifest.write_contents(partial, entries)
        manifest.write(partial, StorePathInfo(
            name=name, key=key, engine="benchtree", version="1.0", variant="cpu", inputs=inputs,
            content_hash=manifest.content_hash(entries), size=sum(e.size for e in entries if e.kind in "fx"),
            files=len(entries), build_seconds=0.0, installed=now_iso(), references=(),
        ))
        freeze(partial)
        os.rename(partial, env)
        why = store.adopt(name, rehash=False)
        assert why is None, why
    return name


def build_env(bench: Bench, root: Path, recipe: Path | None) -> str:
    """A real environment built into `root` (see the module's docstring); its store path name."""
    transformers = REPO / "bench" / "recipes" / "transformers.toml"
    with packages(bench.work, bench.quick, recipe, transformers, standin=True) as pk:
        if recipe is None and bench.quick:
            pk_recipe, index_args = pk.standin, ["--index-url", pk.index.url]
        else:
            pk_recipe, index_args = pk.recipe, pk.index_args
        doc = store_json(bench.meter, root, "build", pk_recipe, "--uv", uv_bin(), *index_args)[0]
    return Path(doc["path"]).name


def bench_verify(bench: Bench, root: Path, name: str, built: bool) -> None:
    from llmgw_store.core import manifest

    env = root / "store" / name
    threads = manifest.THREADS
    entries = manifest.read_contents(env)
    size = sum(e.size for e in entries if e.kind in "fx")
    files = sum(1 for e in entries if e.kind in "fx")
    b3sum = shutil.which("b3sum")
    if b3sum:
        version = subprocess.run([b3sum, "--version"], capture_output=True, text=True).stdout.strip()
        base = Side(f"{version} --num-threads {threads}",
                    ["/bin/sh", "-c",
                     f'find "$0" -type f -print0 | xargs -0 {b3sum} --num-threads {threads} >/dev/null',
                     str(env)])
    else:
        bench.note("b3sum not installed (Debian: apt-get install b3sum): verify is compared with a blake3 pass "
                   "in a fresh python -c instead")
        base = Side(f"blake3 pass in python, {threads} threads", [str(PY), "-c", BASELINE, str(env), str(threads)])
    bench.compare("verify", Side("llmgw-store verify", cli(root, "verify", env)), [base], goal=("<=", 1.05),
                  built=name if built else None,
                  note=f"{'built environment' if built else 'generated tree'} {name}: {size / 1e6:.0f} MB in "
                       f"{files} files, {threads} threads each side; peak RSS counts the page-cache pages of the "
                       "files each maps (resident, not allocated)")


# (b) two neighbouring versions: an engine wheel shared by both, a dependency that differs.
SHARE_RECIPE = """
[engine]
name = "bigengine"
pypi = "bigengine"
binary = "bigengine"

[[build]]
variant = "cpu"
python = "{python}"
version = "1.0"
as_of = "2024-09-01T00:00:00Z"
requirements = ["bigengine==1.0", "bigdep=={dep}"]
verify = ["bigengine"]
"""


def _engine_wheel(dest: Path, name: str, version: str, mb: int, modules: int, seed: int, **kw) -> Path:
    from tests.support.wheels import build_wheel

    rnd = random.Random(seed)
    pkg = name.replace("-", "_")
    extra: dict[str, bytes] = {}
    small = 0
    for m in range(modules):
        size = int(min(40_000, rnd.lognormvariate(8.3, 1.0)))
        text = f"# {name} {version} module {m}\nX = {m}\n" + "#" * size + "\n"
        extra[f"{pkg}/sub{m % 9}/mod{m}.py"] = text.encode()
        small += size
    left = (mb << 20) - small
    i = 0
    while left > 0:
        size = min(left, 24 << 20)
        extra[f"{pkg}/_native{i}.so"] = rnd.randbytes(size)
        left -= size
        i += 1
    return build_wheel(dest, name, version, extra_files=extra, **kw)


def bench_share(bench: Bench, engine_mb: int, modules: int, dep_mb: int) -> None:
    from tests.support.index_server import PackageIndex

    wheels = bench.work / "wheels"
    idx = PackageIndex()
    idx.add("bigengine", _engine_wheel(wheels, "bigengine", "1.0", engine_mb, modules, 1, requires=("bigdep",),
                                       scripts={"bigengine": "bigengine:main"}), "2024-01-01T00:00:00Z")
    idx.add("bigdep", _engine_wheel(wheels, "bigdep", "1.0", dep_mb, modules // 15, 2), "2024-01-01T00:00:00Z")
    idx.add("bigdep", _engine_wheel(wheels, "bigdep", "1.1", dep_mb, modules // 15, 3), "2024-02-01T00:00:00Z")
    idx.start()
    try:
        root = bench.work / "share-root"
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        docs, before, runs = [], [], []
        for dep in ("1.0", "1.1"):
            recipe = bench.work / f"big-{dep}.toml"
            recipe.write_text(SHARE_RECIPE.format(python=python, dep=dep))
            before.append(du_bytes(root / "store"))
            doc, run = store_json(bench.meter, root, "build", recipe, "--index-url", idx.url, "--uv", uv_bin())
            docs.append(doc)
            runs.append(run)
        added = du_bytes(root / "store") - before[1]
        second = Path(docs[1]["path"])
        size2 = json.loads((second / ".llmgw" / "manifest.json").read_text())["size"]
        if bench.meter.run(cli(root, "verify"), check=False).code != 0:
            raise BenchError("verify failed after the second build shared files with the first")
        bench.figure("second version beside the first: disk it adds vs its size", added, "bytes",
                     "its size", size2, goal=("<=", 0.15),
                     note="du of store/ (each inode once) after minus before; verify passes afterwards",
                     detail={"build_s": [round(r.wall_s, 3) for r in runs], "build_rss_mib": [r.rss_mib for r in runs],
                             "share_s": [_share_seconds(r.stderr) for r in runs], "first_on_disk": before[1]})
    finally:
        idx.stop()


def _share_seconds(stderr: str) -> float | None:
    """The seconds the build's `shared N file(s) ... in 1.2s` line reports."""
    import re

    m = re.search(r"shared \d+ file\(s\) .* in ([0-9.]+)s$", stderr, re.MULTILINE)
    return float(m.group(1)) if m else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, rounds=5)
    ap.add_argument("--tree-mb", type=int, help="Verify a generated tree of this many MB instead of a built "
                    "environment.")
    ap.add_argument("--recipe", type=Path, help="Recipe of the verified environment (default "
                    "bench/recipes/transformers.toml from PyPI; --quick black's stand-in from a loopback index).")
    ap.add_argument("--root", type=Path, help="Measure verify on this store's path --name instead of a generated tree.")
    ap.add_argument("--name")
    ap.add_argument("--skip-share", action="store_true")
    ap.add_argument("--skip-verify", action="store_true")
    ap.add_argument("results", nargs="?", type=Path, help="the old form of --out")
    args = ap.parse_args()
    args.out = args.out or args.results
    with Bench("integrity", args) as bench:
        if not args.skip_verify:
            if args.root:
                if not args.name:
                    raise BenchError("--root needs --name (a store path's name)")
                root, name, built = args.root, args.name, True
            elif args.tree_mb:
                root = bench.work / "root"
                name, built = register_tree(root, args.tree_mb), False
            else:
                root = bench.work / "root"
                name, built = build_env(bench, root, args.recipe), True
            bench_verify(bench, root, name, built)
        if not args.skip_share:
            if bench.quick:
                bench_share(bench, engine_mb=6, modules=150, dep_mb=1)
            else:
                bench_share(bench, engine_mb=300, modules=3000, dep_mb=20)
        bench.finish()


if __name__ == "__main__":
    main()
