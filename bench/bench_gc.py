"""Benchmark gc against what a person would type instead, and its planning as the store grows,
side by side (bench/harness.py: alternating fresh processes, medians, median of per-round ratios,
load, peak RSS of the command alone, CPU seconds with every child).

(a) sweep: `llmgw-store gc` of K dead environments against `chmod -R u+w` + `rm -rf` (one shell
    command: a store path is read-only, so both are what deleting it takes) of K identical copies
    (cp -a, no shared inodes) of the same tree. Each environment is a copy of one real environment
    (full: bench/recipes/transformers.toml from PyPI, ~200 MB, ~6,800 files; --quick: a tiny one
    from the loopback index), registered as a store path nothing holds; each round prepares fresh
    copies for both sides outside the timing, and the bytes on disk they held (du, each inode once).
(b) scale, `gc --dry-run` and `generations` as the store grows (issue 25: <= 1.3x):
    - `gc --dry-run` with N registered paths, each a real copy of a built environment (black's
      stand-in from the loopback index: ~400 entries, a few MB; cp -a, installed through the
      library under fresh keys, as a build installs), a third of them held by profiles of 3
      generations, against 2 such paths (issue 33: the dead ones must not be walked);
    - `generations p` with 1,000 generations (made by the library's activate, between two real
      paths) against 10;
    - `gc --dry-run` at those 1,000 generations against 10, and at 1,000 generations with 1,000
      stale temp-roots files (of dead processes) against without.

    python bench/bench_gc.py [--rounds 4] [--k 5] [--out DIR] [--work DIR]    # full run (needs PyPI)
    python bench/bench_gc.py --quick --out DIR                                  # what the test suite runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cli, clone_registered, packages, store_json, uv_bin
from harness import Bench, BenchError, Side, add_common_args, du_bytes


def clone_store(base: Path, root: Path, src_name: str, n: int, profiles: int) -> int:
    """`root`: a copy of the store `base` (which holds the built stand-in `src_name`, held by a
    profile) with `n` more real copies of it (bench/common.clone_registered: cp -a, installed
    and registered through the library under fresh keys), and `profiles` profiles of 3 generations
    each over the first 3 * profiles of them. Returns how many copies no profile holds."""
    subprocess.run(["cp", "-a", str(base), str(root)], check=True)
    names = clone_registered(root, src_name, n, tag=f"scale{n}")
    held = {(p * 3 + g - 1) % n for p in range(profiles) for g in range(1, 4)}
    for p in range(profiles):
        for g in range(1, 4):
            os.symlink(f"../store/{names[(p * 3 + g - 1) % n]}", root / "profiles" / f"bp{p}-{g}-link")
        os.symlink(f"bp{p}-3-link", root / "profiles" / f"bp{p}")
    return n - len(held)


def make_generations(root: Path, paths: list[str], n: int) -> None:
    """Profile `p` with `n` generations, alternating between two store paths (the library's
    activate, as the command does it, without a check)."""
    from llmgw_store.roots.profiles import activate

    for i in range(n):
        activate("p", paths[i % 2], root=root, no_check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, rounds=4)
    ap.add_argument("--k", type=int, help="Dead environments per sweep (default 5; --quick 2).")
    ap.add_argument("--recipe", type=Path, help="Recipe of the swept environments (default "
                    "bench/recipes/transformers.toml from PyPI; --quick: a tiny one from a loopback index).")
    ap.add_argument("--paths", type=int, nargs="+", help="Path counts for the gc --dry-run rows: real copies of "
                    "a built environment (default 200; --quick 20).")
    ap.add_argument("--generations", type=int, help="Generations of the large profile (default 1000; --quick 30).")
    ap.add_argument("--profiles", type=int, help="Profiles (of 3 generations) in each gc --dry-run store "
                    "(default: one per 9 paths).")
    args = ap.parse_args()
    with Bench("gc", args) as bench:
        k = args.k or (2 if bench.quick else 5)
        counts = args.paths or ([20] if bench.quick else [200])
        many = args.generations or (30 if bench.quick else 1000)
        root = bench.work / "root"
        transformers = REPO / "bench" / "recipes" / "transformers.toml"
        # the index runs in every mode: the generations rows build two tiny paths, offline
        with packages(bench.work, bench.quick, args.recipe, transformers, index=True, standin=True) as pk:
            # the scale rows' store: black's stand-in built once (a real build), held by a profile
            base = bench.work / "scale-base"
            black = Path(store_json(bench.meter, base, "build", pk.standin, "--index-url", pk.index.url, "--uv",
                                    uv_bin())[0]["path"])
            subprocess.run(cli(base, "activate", "keep", black), check=True, capture_output=True)
            src = Path(store_json(bench.meter, root, "build", pk.recipe, "--uv", uv_bin(), *pk.index_args)[0]["path"])
            # the original is held by a profile, so gc deletes exactly the K copies
            subprocess.run(cli(root, "activate", "keep", src), check=True, capture_output=True)
            sweep(bench, root, src, k)
            groot = bench.work / "gens-small"
            two = [store_json(bench.meter, groot, "build", pk.tiny, "--index-url", pk.index.url, "--uv", uv_bin(),
                              "--as-of", d)[0]["path"] for d in ("2024-02-02", "2024-06-02")]
        scale(bench, base, black.name, counts, args.profiles)
        generations(bench, groot, [Path(p).name for p in two], many)
        bench.finish()


def sweep(bench: Bench, root: Path, src: Path, k: int) -> None:
    disk: dict[int, int] = {}
    clones: dict[int, list[str]] = {}

    def gc_argv(i):
        clones[i] = clone_registered(root, src.name, k, tag=f"round{i}")
        disk[i] = du_bytes(*(root / "store" / n for n in clones[i]))
        subprocess.run(["sync"], check=True)
        return cli(root, "--json", "gc")

    def gc_after(i, run):
        report = json.loads(run.stdout)
        deleted = sorted(d.get("name") for d in report.get("deleted", []))
        if deleted != sorted(clones[i]):
            raise BenchError(f"gc deleted {deleted}, not the {k} copies {sorted(clones[i])}")
        return {"disk_bytes": disk[i], "freed_on_disk": (report.get("freed") or {}).get("store_paths")}

    trees: dict[int, list[Path]] = {}

    def rm_argv(i):
        base = bench.work / f"rm{i}"
        base.mkdir()
        trees[i] = [base / f"env{j}" for j in range(k)]
        for t in trees[i]:
            subprocess.run(["cp", "-a", str(src), str(t)], check=True)
        disk[1000 + i] = du_bytes(*trees[i])
        subprocess.run(["sync"], check=True)
        return ["/bin/sh", "-c", 'chmod -R u+w "$@" && rm -rf "$@"', "sh", *map(str, trees[i])]

    def rm_after(i, _run):
        if any(os.path.lexists(t) for t in trees[i]):
            raise BenchError(f"rm -rf left {trees[i]}")
        return {"disk_bytes": disk[1000 + i]}

    entries = json.loads((src / ".llmgw" / "manifest.json").read_text()).get("files")
    bench.compare(f"gc of {k} dead environments", Side("llmgw-store gc", gc_argv, after=gc_after),
                  [Side("chmod -R u+w + rm -rf", rm_argv, after=rm_after)], goal=("<=", 1.1), built=src.name,
                  note=f"{k} copies of {src.name} ({entries} entries each); disk_bytes: du of the trees deleted")


def scale(bench: Bench, base: Path, src_name: str, counts: list[int], profiles: int | None) -> None:
    """gc --dry-run at each count of real copies of the built stand-in against 2 copies."""
    roots, dead = {}, {}
    for n in [2, *counts]:
        roots[n] = bench.work / f"scale-{n}"
        dead[n] = clone_store(base, roots[n], src_name, n, min(profiles or max(1, n // 9), max(1, n // 3)))
    entries = json.loads((base / "store" / src_name / ".llmgw" / "manifest.json").read_text()).get("files")
    size = du_bytes(base / "store" / src_name)

    def plans(n):
        def after(_i, run):
            got = len(json.loads(run.stdout).get("deleted", []))
            if got != dead[n]:
                raise BenchError(f"gc --dry-run at {n} paths would delete {got}, not the {dead[n]} no profile holds")
        return after

    for n in counts:
        bench.compare(f"gc --dry-run at {n} paths",
                      Side(f"gc --dry-run, {n} paths", dry_run(roots[n]), after=plans(n)),
                      [Side("gc --dry-run, 2 paths", dry_run(roots[2]), after=plans(2))],
                      goal=("<=", 1.3) if n <= 200 else None, names=[f"gc --dry-run, {n} paths vs 2 paths"],
                      built=src_name,
                      note=f"real copies (cp -a, installed through the library) of a built environment, black's "
                           f"stand-in {src_name} ({entries} entries, {size / 2**20:.1f} MiB on disk each); a third "
                           f"held by profiles of 3 generations, the rest dead")


def dry_run(root: Path) -> list[str]:
    return cli(root, "--json", "gc", "--dry-run")


def generations(bench: Bench, small: Path, names: list[str], many: int) -> None:
    """generations and gc --dry-run at `many` generations against 10, and with stale temp roots."""
    big = bench.work / "gens-big"
    subprocess.run(["cp", "-a", str(small), str(big)], check=True)
    make_generations(small, names, 10)
    make_generations(big, names, many)
    stale = bench.work / "gens-stale"
    subprocess.run(["cp", "-a", str(big), str(stale)], check=True)

    def with_stale(_i):
        # dead processes' temp-roots files (numeric names, nobody holds their lock): made again
        # every round, outside the timing, as a dry run may leave or remove them
        d = stale / "var" / "temproots"
        d.mkdir(mode=0o700, exist_ok=True)
        for j in range(many):
            f = d / str(4_000_000 + j)
            if not f.exists():
                f.write_text("")
                f.chmod(0o600)
        return dry_run(stale)

    def lists(n):
        def after(_i, run):
            doc = json.loads(run.stdout)
            got = len(doc.get("generations", []) if isinstance(doc, dict) else doc)
            if got != n:
                raise BenchError(f"generations listed {got} generations, not {n}")
        return after

    bench.compare(f"generations at {many}",
                  Side(f"generations p, {many} generations", cli(big, "--json", "generations", "p"), after=lists(many)),
                  [Side("generations p, 10 generations", cli(small, "--json", "generations", "p"), after=lists(10))],
                  goal=("<=", 1.3), names=[f"generations, {many} generations vs 10"])
    bench.compare(f"gc --dry-run at {many} generations",
                  Side(f"gc --dry-run, {many} generations", dry_run(big)),
                  [Side("gc --dry-run, 10 generations", dry_run(small))], goal=("<=", 1.3),
                  names=[f"gc --dry-run, {many} generations vs 10"])
    bench.compare(f"gc --dry-run with {many} stale temp roots",
                  Side(f"gc --dry-run, {many} generations + {many} stale temp roots", with_stale),
                  [Side(f"gc --dry-run, {many} generations", dry_run(big))], goal=("<=", 1.3),
                  names=[f"gc --dry-run, {many} stale temp-roots files vs none ({many} generations)"])


if __name__ == "__main__":
    main()
