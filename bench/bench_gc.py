"""Benchmark gc, side by side with its baselines.

(a) sweep: gc of K dead environments against what a person would type to delete the same trees:
    `chmod -R u+w` (a store path is read-only) then `rm -rf`, BOTH timed. Each environment is a
    copy (cp -a, no shared inodes) of one real environment built from PyPI (default
    bench/recipes/transformers.toml, ~200 MB, ~6,800 files); the copies are registered in the
    index as store paths nothing holds. Repeated --reps times, alternating which side runs first
    (the first to run meets a colder dentry cache); ratio = gc wall time / baseline wall time, the
    median of the reps. Peak RSS of each side's process (wait4) is reported too.
(b) planning: `gc --dry-run` on an index of 10,000 paths and 100 profiles with 3 generations each
    (small directories: the cost measured is reading roots, marking and choosing).

    .venv/bin/python bench/bench_gc.py --out /tmp/bench-results [--k 5] [--reps 4] [--recipe ...]

Results go to OUT/gc.json (never into the checkout). The machine is shared and noisy: compare
ratios from one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CLI, clone_registered  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def measured(argv: list[str], cwd: Path | None = None) -> tuple[float, int, str]:
    """(wall seconds, peak RSS in KiB, stdout) of one command, waited for with wait4."""
    with tempfile.TemporaryFile() as out:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]} exited {proc.returncode}")
        out.seek(0)
        return seconds, usage.ru_maxrss, out.read().decode()


def baseline(trees: list[Path]) -> tuple[float, int]:
    """`chmod -R u+w` then `rm -rf` of the trees, timed together; peak RSS of the larger."""
    s1, r1, _ = measured(["chmod", "-R", "u+w", *map(str, trees)])
    s2, r2, _ = measured(["rm", "-rf", *map(str, trees)])
    return s1 + s2, max(r1, r2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="Directory for gc.json (created).")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--reps", type=int, default=4, help="Sweeps; even ones run gc first, odd ones the baseline first.")
    ap.add_argument("--recipe", type=Path, default=REPO / "bench" / "recipes" / "transformers.toml")
    ap.add_argument("--paths", type=int, default=10_000)
    ap.add_argument("--profiles", type=int, default=100)
    ap.add_argument("--work", type=Path, help="Scratch directory (default: a new one under $TMPDIR).")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = "only-system"
    from uv import find_uv_bin

    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-gc-", dir=args.work))
    results: dict = {"k": args.k, "recipe": str(args.recipe), "sweeps": []}
    try:
        root = work / "root"
        doc = json.loads(subprocess.run([str(CLI), "--root", str(root), "--json", "build", str(args.recipe), "--uv",
                                         find_uv_bin()], check=True, capture_output=True, text=True).stdout)
        src = Path(doc["path"])
        # the original is held by a profile, so gc deletes exactly the K copies
        subprocess.run([str(CLI), "--root", str(root), "activate", "keep", str(src)], check=True, capture_output=True)
        entries = json.loads((src / ".llmgw" / "manifest.json").read_text())["files"]
        for rep in range(args.reps):
            names = clone_registered(root, src.name, args.k, tag=f"rep{rep}")
            base = work / f"rm{rep}"
            base.mkdir()
            trees = [base / f"env{i}" for i in range(args.k)]
            for t in trees:
                subprocess.run(["cp", "-a", str(src), str(t)], check=True)
            subprocess.run(["sync"], check=True)
            gc_first = rep % 2 == 0

            def run_gc() -> tuple[float, int, dict]:
                s, rss, out = measured([str(CLI), "--root", str(root), "--json", "gc"])
                return s, rss, json.loads(out)

            if gc_first:
                gc_s, gc_rss, report = run_gc()
                rm_s, rm_rss = baseline(trees)
            else:
                rm_s, rm_rss = baseline(trees)
                gc_s, gc_rss, report = run_gc()
            assert sorted(d["name"] for d in report["deleted"]) == sorted(names), report["deleted"]
            base.rmdir()
            sweep = {"first": "gc" if gc_first else "baseline", "gc_s": round(gc_s, 3), "baseline_s": round(rm_s, 3),
                     "ratio": round(gc_s / rm_s, 3), "gc_peak_rss_kib": gc_rss, "baseline_peak_rss_kib": rm_rss,
                     "freed_on_disk": report["freed"]["store_paths"],
                     "apparent": sum(d["size"] for d in report["deleted"])}
            results["sweeps"].append(sweep)
            print(f"(a) sweep {rep + 1}/{args.reps} ({sweep['first']} first): gc {gc_s:.2f} s (peak RSS {gc_rss / 1024:.0f} MiB)"
                  f"   chmod -R u+w + rm -rf {rm_s:.2f} s (peak RSS {rm_rss / 1024:.0f} MiB)   ratio {gc_s / rm_s:.2f}")
        ratios = [s["ratio"] for s in results["sweeps"]]
        results["ratio_median"] = statistics.median(ratios)
        size = results["sweeps"][0]["freed_on_disk"]
        print(f"(a) gc of {args.k} dead environments ({size / 2**20:.0f} MiB on disk, {entries * args.k} entries): "
              f"median ratio {results['ratio_median']:.2f} over {len(ratios)} sweeps (goal <= 1.1)")

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
        plan_s, plan_rss, out = measured([str(CLI), "--root", str(proot), "--json", "gc", "--dry-run"])
        plan = json.loads(out)
        results["planning"] = {"paths": args.paths, "profiles": args.profiles, "seconds": round(plan_s, 3),
                               "peak_rss_kib": plan_rss, "dead": len(plan["deleted"])}
        print(f"(b) gc --dry-run planning on {args.paths} paths, {args.profiles} profiles x 3 generations: "
              f"{plan_s:.2f} s, peak RSS {plan_rss / 1024:.0f} MiB ({len(plan['deleted'])} dead)")
    finally:
        (args.out / "gc.json").write_text(json.dumps(results, indent=2) + "\n")
        print(f"results: {args.out / 'gc.json'}")
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
