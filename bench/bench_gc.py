"""Benchmark gc, side by side with its baselines.

(a) sweep: gc of K dead environments against `rm -rf` of K identical trees. Each environment is a
    copy (cp -a, no shared inodes) of one real environment built from PyPI (default
    bench/recipes/transformers.toml, ~200 MB, ~6,800 files); the copies are registered in the
    index as store paths nothing holds. Ratio = gc wall time / rm -rf wall time.
(b) planning: `gc --dry-run` on an index of 10,000 paths and 100 profiles with 3 generations each
    (small directories: the cost measured is reading roots, marking and choosing).

    .venv/bin/python bench/bench_gc.py [--k 5] [--recipe bench/recipes/transformers.toml]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CLI, clone_registered  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--recipe", type=Path, default=REPO / "bench" / "recipes" / "transformers.toml")
    ap.add_argument("--paths", type=int, default=10_000)
    ap.add_argument("--profiles", type=int, default=100)
    args = ap.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = "only-system"
    from uv import find_uv_bin

    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-gc-"))
    try:
        root = work / "root"
        doc = json.loads(subprocess.run([str(CLI), "--root", str(root), "--json", "build", str(args.recipe), "--uv",
                                         find_uv_bin()], check=True, capture_output=True, text=True).stdout)
        src = Path(doc["path"]).name
        names = clone_registered(root, src, args.k)
        # the original is held by a profile, so gc deletes exactly the K copies
        subprocess.run([str(CLI), "--root", str(root), "activate", "keep", doc["path"]], check=True, capture_output=True)
        baseline = work / "rm"
        baseline.mkdir()
        for i in range(args.k):
            subprocess.run(["cp", "-a", doc["path"], str(baseline / f"env{i}")], check=True)
        subprocess.run(["sync"], check=True)
        t = time.perf_counter()
        report = json.loads(subprocess.run([str(CLI), "--root", str(root), "--json", "gc"], check=True,
                                           capture_output=True, text=True).stdout)
        gc_s = time.perf_counter() - t
        assert sorted(d["name"] for d in report["deleted"]) == sorted(names), report["deleted"]
        subprocess.run(["chmod", "-R", "u+w", str(baseline)], check=True)  # rm needs what gc does itself
        t = time.perf_counter()
        subprocess.run(["rm", "-rf", str(baseline)], check=True)
        rm_s = time.perf_counter() - t
        size = report["freed"]["store_paths"]
        print(f"(a) gc of {args.k} dead environments ({size / 1e6:.0f} MB, {doc and json.loads((Path(doc['path']) / '.llmgw' / 'manifest.json').read_text())['files'] * args.k} entries): "
              f"{gc_s:.2f} s   rm -rf of the same trees: {rm_s:.2f} s   ratio {gc_s / rm_s:.2f} (goal <= 1.2)")

        # (b) planning on a big index
        proot = work / "plan"
        sys.path.insert(0, str(REPO))
        from llmgw_store.core.local_store import Store

        with Store.open(proot) as store:
            conn = store.index.conn
            conn.execute("BEGIN")
            for i in range(args.paths):
                name = f"{i:032d}-eng-1.0-cpu"
                (store.layout.store / name).mkdir()
                conn.execute("INSERT INTO paths (name, key, engine, version, variant, size, files, inputs, last_used) "
                             "VALUES (?, ?, 'eng', '1.0', 'cpu', 1000, 1, '{}', ?)", (name, f"{i:032d}", f"2025-01-01T{i % 24:02d}:00:00Z"))
            conn.execute("COMMIT")
            for p in range(args.profiles):
                for g in range(1, 4):
                    os.symlink(f"../store/{(p * 3 + g):032d}-eng-1.0-cpu", store.layout.profiles / f"p{p}-{g}-link")
                os.symlink(f"p{p}-3-link", store.layout.profiles / f"p{p}")
        t = time.perf_counter()
        plan = json.loads(subprocess.run([str(CLI), "--root", str(proot), "--json", "gc", "--dry-run"], check=True,
                                         capture_output=True, text=True).stdout)
        plan_s = time.perf_counter() - t
        print(f"(b) gc --dry-run planning on {args.paths} paths, {args.profiles} profiles x 3 generations: "
              f"{plan_s:.2f} s ({len(plan['deleted'])} dead)")
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
