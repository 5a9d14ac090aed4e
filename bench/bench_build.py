"""Benchmark `llmgw-store build` against what a user would run instead, side by side
(bench/harness.py: alternating fresh processes, medians, median of per-round ratios, load, peak RSS
of the command alone, CPU seconds with every child, compileall's unwaited workers included).

A warm-up build of RECIPE fills a store (and its uv cache). Then:
  hit          `llmgw-store build RECIPE` of that key (a cache hit) against the same interpreter's
               bare start, `python -c pass` (issue 25: <= 1.5x from a regular install) and
               `python -I -S -c pass` beside it. A hot-path row: refused from an editable install
               (or flagged, with --allow-editable and in --quick); it names the interpreter.
  cold build, warm cache
               the store building a copy of RECIPE with `as_of` fixed to the warm-up's date into a
               fresh root holding what the warm-up's node keeps for its next build (its uv cache and
               its wheel home: store/.wheels with the seals var/wheels; see warm_store_root), against
               the seed's commands by hand from a plain uv cache holding the same wheels as real
               directories (see warm_hand_cache), with the same uv and the same date:
                   uv venv --relocatable --python INTERPRETER --python-preference P
                       (INTERPRETER: the one the store chose, bin/python of its warm-up)
                   uv pip compile --generate-hashes --exclude-newer DATE --index-url URL
                   uv pip install --require-hashes --no-deps -r LOCK     (uv's DEFAULT link mode)
                   python -m compileall -j N --invalidation-mode unchecked-hash lib/
                       (the store compiles; N = the store's workers for this tree)
                   the recipe's `verify` command, the environment's bin/ first on PATH
               (issue 25: <= 1.10x for vLLM, <= 1.25x black, <= 1.10x transformers). Each side's
               steps (the store's from its JSON `steps`, the script's timed by bash) and the disk
               of what it made (du, each inode once) are kept.
  cold build, cold cache
               the same two sides with empty caches (both download: PyPI, or the loopback index).
  disk         one environment plus everything the store keeps for it after the default `gc`
               (the path rooted by a profile) against the environment alone (<= 1.15x).
  neighbour    (--neighbour-as-of / --neighbour-version) a neighbouring build into that store:
               the disk it adds against its size (<= 15 %), and its bytecode step against the
               first build's (<= 25 %).

    python bench/bench_build.py [--recipe examples/black.toml] [--rounds 5] [--out DIR]   # needs PyPI
    python bench/bench_build.py --recipe bench/recipes/transformers.toml --rounds 5
    python bench/bench_build.py --quick --out DIR                           # the test suite's (offline)
A recipe with an extra index (PEP 751 lock) has no by-hand baseline here and is refused.
bench/bench_vllm.sh runs this bench on vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, REPO, cli, packages, store_json, uv_bin
from harness import Bench, BenchError, Run, Side, add_common_args, clean_env, du_bytes, rmtree

# The seed's commands, one bash script (one process tree, measured as a whole); each step's start
# and end go to stdout for the row's steps.
BY_HAND = r"""
set -euo pipefail
uv=$1 request=$2 pref=$3 venv=$4 reqs=$5 lock=$6 asof=$7 index=$8 jobs=$9; shift 9
step() { local name=$1 t0=$EPOCHREALTIME; shift; "$@" >/dev/null; echo "step $name $t0 $EPOCHREALTIME"; }
step venv "$uv" venv -q --relocatable --python "$request" --python-preference "$pref" "$venv"
step resolve "$uv" pip compile -q "$reqs" -o "$lock" --generate-hashes --exclude-newer "$asof" \
    --index-url "$index" --python "$venv/bin/python" --no-header
step install "$uv" pip install -q --require-hashes --no-deps -r "$lock" --index-url "$index" --python "$venv/bin/python"
step bytecode "$venv/bin/python" -m compileall -q -j "$jobs" --invalidation-mode unchecked-hash "$venv/lib"
if [ $# -gt 0 ]; then PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" step verify "$@"; fi
"""


COLD_GOALS = {"black": 1.25}  # issue 33's cold-build goal per engine (1.10: transformers, vLLM, the rest)


def script_steps(stdout: str) -> dict[str, float]:
    steps = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "step":
            steps[parts[1]] = round(float(parts[3]) - float(parts[2]), 3)
    return steps


def step_of(steps: dict, *words: str) -> float | None:
    """The seconds of the first step whose name has one of `words` (names are the store's own)."""
    for name, secs in (steps or {}).items():
        if any(w in name for w in words) and isinstance(secs, (int, float)):
            return float(secs)
    return None


ARCHIVE_BUCKET = "archive-v0"  # uv's bucket of unpacked wheels; in a store's cache, the link to the wheel home


def wheel_home_of(uv_cache: Path) -> Path:
    """The directory a store's uv cache keeps its unpacked wheels in: the wheel home its
    `archive-v0` links to (store/build/cacheuse.WHEEL_HOME_LINK), or the bucket itself."""
    bucket = uv_cache / ARCHIVE_BUCKET
    if bucket.is_symlink():
        home = Path(os.path.normpath(bucket.parent / os.readlink(bucket)))
        if home.name != ".wheels" or home.parent.name != "store" or not home.is_dir():
            raise BenchError(f"{bucket} links to {home}, not to a store's wheel home: update bench_build's warm copies")
        return home
    return bucket


def entries(bucket: Path) -> set[str]:
    """The unpacked wheels of a bucket (or wheel home) by uv's archive id."""
    return {e.name for e in os.scandir(bucket) if e.is_dir(follow_symlinks=False)} if bucket.is_dir() else set()


def copy_uv_cache(src: Path, dest: Path) -> None:
    """uv's cache, hard-linked (cp -al: uv writes a cache entry whole and renames it into place,
    never into a linked file), without its lock file (each cache its own, as on two machines)."""
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
    (dest / ".lock").unlink(missing_ok=True)


def warm_hand_cache(warm_cache: Path, dest: Path) -> None:
    """A plain uv cache as the seed's commands leave it after the same build: the warm root's uv
    cache with `archive-v0` a real directory holding the same unpacked wheels (the wheel home's
    entries, hard-linked: the same bytes, no copy to write back while the row is timed). uv's other
    buckets point into it by relative paths (`wheels-v*/…/<version>-<tag> ->
    ../../../../archive-v0/<id>`), which resolve in the copy."""
    copy_uv_cache(warm_cache, dest)
    bucket = dest / ARCHIVE_BUCKET
    if bucket.is_symlink():
        bucket.unlink()
    else:
        rmtree(bucket)
    subprocess.run(["cp", "-al", str(wheel_home_of(warm_cache)), str(bucket)], check=True)


def warm_store_root(warm: Path, root: Path) -> None:
    """A fresh root holding what a node that has built keeps for its next build (and nothing of the
    build itself: no store path, index, memo or bytecode cache): its uv cache, whose `archive-v0`
    is the store's relative link `../../store/.wheels`, so it points into this root; its wheel home
    store/.wheels, hard-linked (the inodes the warm root's environment links, as a node's wheel home
    is linked by its earlier paths); and the seals var/wheels, copied (a seal must have one link,
    system/files one_link). The build then checks each entry against its seal by shape and every
    linked file's digest in its scan, as a second build on that node does: a seal that did not fit
    would fail it (DamagedWheel, evicted, unpacked again), which store_after sees."""
    (root / "cache").mkdir(mode=0o700, parents=True)
    (root / "store").mkdir(mode=0o755)
    (root / "var").mkdir(mode=0o700)
    copy_uv_cache(warm / "cache" / "uv", root / "cache" / "uv")
    subprocess.run(["cp", "-al", str(warm / "store" / ".wheels"), str(root / "store" / ".wheels")], check=True)
    subprocess.run(["cp", "-a", str(warm / "var" / "wheels"), str(root / "var" / "wheels")], check=True)


def compile_workers(env_path: Path) -> int:
    """The store's number of compile workers for this tree (all cores where it cannot be asked)."""
    modules = sum(f.endswith(".py") for _, _, fs in os.walk(env_path / "lib") for f in fs)
    try:
        from llmgw_store.build.bytecode import workers

        return int(workers(modules))
    except (ImportError, TypeError, ValueError):
        return len(os.sched_getaffinity(0))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, rounds=5)
    ap.add_argument("--recipe", type=Path, help="default examples/black.toml (--quick: a tiny recipe, loopback index)")
    ap.add_argument("--variant", help="passed to build")
    ap.add_argument("--version", help="passed to build")
    ap.add_argument("--python-preference", default=os.environ.get("LLMGW_STORE_PYTHON_PREFERENCE", "only-system"),
                    help="both sides' (default only-system: this host's interpreters)")
    ap.add_argument("--skip-hit", action="store_true")
    ap.add_argument("--skip-cold-cache", action="store_true", help="no cold-cache row (it downloads every run)")
    ap.add_argument("--neighbour-as-of", help="a neighbouring build: the recipe at this date (ISO, or +Nd from the "
                    "first build's date)")
    ap.add_argument("--neighbour-version", help="a neighbouring build: this version")
    ap.add_argument("--name", default="build", help="the bench's name in its result file (NAME.json)")
    args = ap.parse_args(argv)
    with Bench(args.name, args) as bench:
        os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = args.python_preference
        with packages(bench.work, bench.quick, args.recipe, REPO / "examples" / "black.toml") as src:
            run_all(bench, args, src.recipe, src.index_args)
        bench.finish()


def run_all(bench: Bench, args, recipe: Path, index_args: list[str]) -> None:
    flag = None if args.skip_hit else bench.hot_path()  # refused before any work, not after the warm-up
    uv = uv_bin()
    pick = [*(["--variant", args.variant] if args.variant else []),
            *(["--version", args.version] if args.version else [])]
    warm = bench.work / "warm"
    first, _ = store_json(bench.meter, warm, "build", recipe, "--uv", uv, *index_args, *pick)
    env = Path(first["path"])
    manifest = json.loads((env / ".llmgw" / "manifest.json").read_text())
    as_of = first.get("as_of") or manifest.get("exclude_newer")
    request = (manifest.get("inputs", {}).get("python") or {}).get("request")
    index_url = manifest.get("index_url") or (index_args[1] if index_args else "https://pypi.org/simple")
    build = next((b for b in tomllib.loads(recipe.read_text()).get("build", [])
                  if not args.variant or b.get("variant") == args.variant), {})
    if build.get("extra_index"):
        raise BenchError(f"{recipe}: a build with an extra index has no by-hand baseline here")
    if not (as_of and request):
        raise BenchError(f"the warm-up build's JSON/manifest gives no as_of or python request: {first}")
    uv_cache = warm / "cache" / "uv"
    if not uv_cache.is_dir():
        raise BenchError(f"the store keeps no uv cache at {uv_cache}: update bench_build's warm-cache copy")
    warm_wheels = entries(wheel_home_of(uv_cache))
    if not warm_wheels:
        raise BenchError(f"the warm-up build left no unpacked wheel in {wheel_home_of(uv_cache)}: nothing is warm")
    # The same interpreter on both sides: the by-hand side is given the one the store chose (in a
    # store other users read, one they can run; `uv venv --python 3.11` by hand may take another,
    # root's pyenv here, which compiles at another speed).
    interpreter = os.readlink(env / "bin" / "python")
    print(f"warm-up build: {env.name} (as_of {as_of}, python {request}: {interpreter})", file=sys.stderr)

    if not args.skip_hit:
        hit_argv = cli(warm, "build", recipe, "--uv", uv, *index_args, *pick)

        def hit_after(_i, run: Run):
            if run.stdout.strip() != str(env):
                raise BenchError(f"the hit printed {run.stdout.strip()!r}, not {env}")

        bench.compare("cache-hit build", Side("llmgw-store build (hit)", hit_argv, after=hit_after),
                      [Side("python -c pass", [str(PY), "-c", "pass"]),
                       Side("python -I -S -c pass", [str(PY), "-I", "-S", "-c", "pass"])],
                      goal=[("<=", 1.5), None], hot=True, note=flag)

    fixed = bench.work / f"as-of-{recipe.name}"
    fixed.write_text("".join(line + (f'\nas_of = "{as_of}"' if line.strip() == "[[build]]" else "") + "\n"
                             for line in recipe.read_text().splitlines()))
    reqs = bench.work / "requirements.in"
    reqs.write_text("".join(r + "\n" for r in manifest.get("requirements", [])))
    verify = [str(a) for a in build.get("verify") or []]
    jobs = compile_workers(env)
    hand_env = clean_env({"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"})
    last_store_root: dict[str, Path] = {}

    seals_before: dict[int, dict[str, int]] = {}

    def seal_inodes(root: Path) -> dict[str, int]:
        """Each seal's inode: a seal written again (sealed anew) is a new file, renamed into place."""
        return {e.name: e.inode() for e in os.scandir(root / "var" / "wheels")}

    def not_warm(new: set[str], who: str) -> None:
        if new:
            raise BenchError(f"{who} {len(new)} wheel(s) anew ({sorted(new)[:3]}), which the warm-up root "
                             "held ready: the warm-cache row was not warm")

    def sides(cache: str) -> tuple[Side, Side]:
        def store_argv(i):
            root = bench.work / f"store-{cache}-{i}"
            rmtree(root)
            if cache == "warm":
                warm_store_root(warm, root)
                seals_before[i] = seal_inodes(root)
            return cli(root, "--json", "build", fixed, "--uv", uv, *index_args, *pick)

        def store_after(i, run: Run):
            doc = json.loads(run.stdout)
            if doc.get("cache_hit") or doc.get("as_of", as_of) != as_of:
                raise BenchError(f"the store's cold build was a hit or resolved at another date: {doc}")
            root = bench.work / f"store-{cache}-{i}"
            if cache == "warm":
                not_warm(entries(root / "store" / ".wheels") - warm_wheels, "the store unpacked")
                after = seal_inodes(root)
                not_warm({n for n in after if seals_before[i].get(n) != after[n]}, "the store sealed")
            out = {"disk_env_bytes": du_bytes(Path(doc["path"])), "steps": doc.get("steps") or {}}
            previous = last_store_root.get(cache)
            if previous and previous != root:
                rmtree(previous)
            last_store_root[cache] = root
            return out

        def hand_argv(i):
            d = bench.work / f"hand-{cache}-{i}"
            rmtree(d)
            d.mkdir()
            if cache == "warm":
                warm_hand_cache(uv_cache, d / "cache")
            hand_env["UV_CACHE_DIR"] = str(d / "cache")
            return ["/bin/bash", "-c", BY_HAND, "by-hand", uv, interpreter, args.python_preference, d / "env", reqs,
                    d / "lock", as_of, index_url, str(jobs), *verify]

        def hand_after(i, run: Run):
            d = bench.work / f"hand-{cache}-{i}"
            if cache == "warm":
                not_warm(entries(d / "cache" / ARCHIVE_BUCKET) - warm_wheels, "uv unpacked")
            out = {"disk_env_bytes": du_bytes(d / "env"), "disk_env_and_cache_bytes": du_bytes(d / "env", d / "cache"),
                   "steps": script_steps(run.stdout)}
            rmtree(d)
            return out

        return (Side("llmgw-store build (as_of fixed)", store_argv, after=store_after),
                Side("seed's uv commands (default link mode) + compileall", hand_argv, env=hand_env, after=hand_after))

    note = (f"by hand: uv venv --python {interpreter} (the store's choice)/pip compile/pip install (link mode: "
            f"uv's default), compileall -j {jobs} unchecked-hash, verify {verify or '(none)'}; same uv ({uv}), "
            f"same date {as_of}")
    goal = COLD_GOALS.get(tomllib.loads(recipe.read_text()).get("engine", {}).get("name"), 1.10)
    store_side, hand_side = sides("warm")
    bench.compare("cold build, warm cache", store_side, [hand_side], goal=("<=", goal), note=note,
                  names=["cold build, warm uv cache vs the seed's commands"], warmup=False)
    if not args.skip_cold_cache:
        s, h = sides("cold")
        bench.compare("cold build, cold cache", s, [h], goal=("<=", goal), note=note,
                      names=["cold build, empty caches vs the seed's commands"], warmup=False)
        rmtree(last_store_root.pop("cold", Path("/nonexistent")))
    first_steps = store_side.extras[-1].get("steps", {})
    # The last warm root's wheel home shares its inodes with the warm-up root's (warm_store_root):
    # gone, its entries' link counts are this root's own, as gc reads them (wheelhome.linked).
    rmtree(warm)
    disk_and_neighbour(bench, args, last_store_root["warm"], fixed, recipe, uv, index_args, pick, as_of, first_steps)


def store_uv(root: Path) -> Path:
    """The store's own uv store path in `root`, made as a build without --uv makes it (the library's
    uv.resolve: the shipped binary copied in, else uv's wheel from PyPI)."""
    from llmgw_store.build.uv import resolve
    from llmgw_store.core.local_store import Store

    with Store.open(root) as store:
        tool = resolve(store, None, "https://pypi.org/simple")
    return Path(tool.path).parent.parent


def disk_and_neighbour(bench: Bench, args, root: Path, fixed: Path, recipe: Path, uv: str, index_args: list[str],
                       pick: list[str], as_of: str, first_steps: dict) -> None:
    doc = json.loads(subprocess.run(cli(root, "--json", "build", fixed, "--uv", uv, *index_args, *pick),
                                    check=True, capture_output=True, text=True).stdout)
    env = Path(doc["path"])
    subprocess.run(cli(root, "activate", "bench", env), check=True, capture_output=True)  # rooted: gc keeps it
    uv_path = store_uv(root)  # what a user's first build without --uv makes: the store's own uv
    gc = bench.meter.run(cli(root, "--json", "gc"))
    kept, alone = du_bytes(root), du_bytes(env)
    # Costs of the root whatever it holds, reported on their own row: the store's uv (a store path
    # gc keeps) and the gc reserve (core/reserve.py).
    fixed = {"uv store path": du_bytes(uv_path), "gc reserve": du_bytes(root / "var" / "gc-reserve")}
    bench.figure("disk: one environment + all the store keeps for it after the default gc", kept - sum(fixed.values()),
                 "bytes", "the environment alone", alone, goal=("<=", 1.15), built=env.name,
                 note="du of the whole root (store, caches, index; each inode once) after `gc`, less the per-root "
                      "fixed costs (their own row)",
                 detail={"gc_s": round(gc.wall_s, 3), "gc_freed": (json.loads(gc.stdout).get("freed") or {}),
                         "root_bytes": kept, "by_parts": {p.name: du_bytes(p) for p in sorted(root.iterdir())},
                         "pyc_cache": du_bytes(root / "cache" / "pyc"),  # its entries are the env's pycs: counted once
                         # its files are the environment's too (hard links): counted once in the figure
                         "wheel_home": du_bytes(root / "store" / ".wheels")})
    bench.figure("disk: per-root fixed costs (the store's uv, the gc reserve)", sum(fixed.values()), "bytes",
                 "the environment alone", alone, built=env.name, detail=fixed,
                 note="paid once per store root, whatever it holds: du of the store's uv path and var/gc-reserve")
    if not (args.neighbour_as_of or args.neighbour_version):
        return
    when = args.neighbour_as_of
    if when and when.startswith("+") and when.endswith("d"):
        from datetime import datetime, timedelta

        base = datetime.fromisoformat(as_of.replace("Z", "+00:00"))
        when = (base + timedelta(days=int(when[1:-1]))).strftime("%Y-%m-%dT%H:%M:%SZ")
    extra = ["--as-of", when] if when else []
    version = args.neighbour_version or args.version
    npick = [*(["--variant", args.variant] if args.variant else []), *(["--version", version] if version else [])]
    before = du_bytes(root)
    ndoc, run = store_json(bench.meter, root, "build", recipe, "--uv", uv, *index_args, *npick, *extra)
    if ndoc.get("cache_hit") or ndoc.get("path") == str(env):
        raise BenchError(f"the neighbour ({' '.join(extra)}) is the same store path: pick another")
    added = du_bytes(root) - before
    npath = Path(ndoc["path"])
    size = json.loads((npath / ".llmgw" / "manifest.json").read_text()).get("size") or du_bytes(npath)
    label = " ".join([*extra, *(["--version", args.neighbour_version] if args.neighbour_version else [])])
    bench.figure(f"neighbour ({label}): disk it adds vs its size", added, "bytes", "its size", size,
                 goal=("<=", 0.15), note="du of the root before and after its build",
                 detail={"build_s": round(run.wall_s, 3), "rss_mib": run.rss_mib, "path": npath.name})
    nb, fb = step_of(ndoc.get("steps"), "bytecode", "compile"), step_of(first_steps, "bytecode", "compile")
    if nb is None or fb is None:
        bench.note(f"no bytecode step in the build JSON's steps ({list((ndoc.get('steps') or {}).keys())}): "
                   "the neighbour's bytecode row is missing")
        return
    bench.figure(f"neighbour ({label}): its bytecode step vs the first build's", nb, "s", "first build's bytecode",
                 fb, goal=("<=", 0.25), note="the build JSON's steps (seconds)",
                 detail={"steps": ndoc.get("steps"), "first_steps": first_steps})


if __name__ == "__main__":
    main()
