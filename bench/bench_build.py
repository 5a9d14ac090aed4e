"""Benchmark `llmgw-store build` against its baselines, side by side in one run.

(a) cache hit: `llmgw-store build RECIPE` of a key already in the store, against a bare interpreter
    start (`python -c pass` with the same python), interleaved, N runs each; medians and ratio.
(b) cold build: a fresh store building RECIPE, against the same work done by hand (uv venv --python
    REQUEST (the recipe's: uv finds the interpreter, as the store must), uv pip compile --generate-hashes --exclude-newer DATE, uv pip install --require-hashes --no-deps
    --link-mode copy, `python -m compileall -j N --invalidation-mode unchecked-hash` (the store's
    pyc mode and number of workers), the recipe's verify command) on the same requirements. The store builds twice per
    round: a copy of RECIPE with `as_of = DATE` (the ratio: the same work as the baseline, which is
    given DATE by hand) and RECIPE as it is (the store asks the index for the publication date).
    All start from a copy of one warm uv cache and use the same uv binary, so the ratio is
    llmgw-store's own cost, not the network's. Interleaved, R rounds; medians, ratios, and each
    side's steps in its median run (the store's: the JSON's `steps`).
Peak RSS: measured by GNU time (`/usr/bin/time -f %M`), of each command and the children it waited for.

    .venv/bin/python bench/bench_build.py --out /tmp/bench [--recipe examples/black.toml] [--hits 30] [--colds 3]

Needs PyPI (the recipe resolves there). Prints a table and writes OUT/build.json (never into the checkout).
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
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from common import CLI, PY, peak_rss_mb, timed  # noqa: E402


def build(root: Path, recipe: Path, uv: Path, *extra: str) -> dict:
    out = subprocess.run([str(CLI), "--root", str(root), "--json", "build", str(recipe), "--uv", str(uv), *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=REPO / "examples" / "black.toml")
    ap.add_argument("--hits", type=int, default=30)
    ap.add_argument("--colds", type=int, default=3)
    ap.add_argument("--python-preference", default="only-system")
    ap.add_argument("--out", type=Path, required=True, help="directory for build.json (outside the checkout)")
    args = ap.parse_args()

    from uv import find_uv_bin

    uv = Path(find_uv_bin())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["LLMGW_STORE_PYTHON_PREFERENCE"] = args.python_preference
    os.environ.update(env)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    try:
        # Warm-up: one build fills a uv cache both sides of (b) start from, and is the store of (a).
        warm = work / "warm"
        first = build(warm, args.recipe, uv)
        print(f"warm-up build: {first['path']} ({first['seconds']:.2f}s)", file=sys.stderr)
        manifest = json.loads((Path(first["path"]) / ".llmgw" / "manifest.json").read_text())

        # (a) cache hit vs bare interpreter start, interleaved.
        hit_t, bare_t = [], []
        hit_argv = [str(CLI), "--root", str(warm), "build", str(args.recipe), "--uv", str(uv)]
        for _ in range(args.hits):
            bare_t.append(timed([str(PY), "-c", "pass"]))
            hit_t.append(timed(hit_argv))
        hit_rss, bare_rss = peak_rss_mb(hit_argv), peak_rss_mb([str(PY), "-c", "pass"])
        # The same hit as a library call in one process (no interpreter start, no click).
        sys.path.insert(0, str(REPO))
        from llmgw_store.build.builder import BuildOptions
        from llmgw_store.build.builder import build as lib_build
        from llmgw_store.build.uv import clean_env  # the variables a store build passes to uv (proxy, CA)

        opts = BuildOptions(uv=uv, python_preference=args.python_preference)
        lib_t = []
        for _ in range(args.hits):
            t = time.perf_counter()
            assert lib_build(args.recipe, opts, root=warm).cache_hit
            lib_t.append(time.perf_counter() - t)

        # (b) cold build vs the same work by hand, each from a copy of the warm uv cache. Two store
        # builds per round: RECIPE as it is (the store asks the index when the release was published:
        # one request), and a copy of it with that date fixed as `as_of` (no request) — the baseline is
        # given the date by hand, so the second is the same work.
        request = manifest["inputs"]["python"]["request"]
        as_of = manifest["exclude_newer"]
        index_url = manifest["index_url"]
        reqs = work / "requirements.in"
        reqs.write_text("".join(r + "\n" for r in manifest["requirements"]))
        fixed = work / args.recipe.name
        fixed.write_text("".join(line + (f'\nas_of = "{as_of}"' if line.strip() == "[[build]]" else "") + "\n"
                                 for line in args.recipe.read_text().splitlines()))
        verify = tomllib.loads(args.recipe.read_text())["build"][0].get("verify")
        from llmgw_store.build.bytecode import workers  # the store's choice: every core, fewer for a small tree

        modules = sum(f.endswith(".py") for _, _, fs in os.walk(Path(first["path"]) / "lib") for f in fs)
        jobs = workers(modules)
        sides = {"cold_as_of": fixed, "cold_lookup": args.recipe}
        times: dict[str, list[float]] = {k: [] for k in [*sides, "raw"]}
        steps: dict[str, list] = {k: [] for k in [*sides, "raw"]}
        cold_rss, raw_rss = [0.0], [0.0]
        for i in range(args.colds):
            for side, recipe in sides.items():
                root = work / f"{side}{i}"
                (root / "cache").mkdir(parents=True)
                subprocess.run(["cp", "-al", str(warm / "cache" / "uv"), str(root / "cache" / "uv")], check=True)
                out_file = work / f"{side}{i}.json"
                rss_file = work / f"{side}{i}.rss"
                t = time.perf_counter()
                with open(out_file, "w") as out:
                    # GNU time (a small parent) measures the peak RSS; its own cost is a millisecond.
                    subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(rss_file), str(CLI), "--root", str(root),
                                    "--json", "build", str(recipe), "--uv", str(uv)], stdout=out,
                                   stderr=subprocess.DEVNULL, check=True)
                times[side].append(time.perf_counter() - t)
                cold_rss.append(int(rss_file.read_text().split()[-1]) / 1024)
                doc = json.loads(out_file.read_text())
                assert doc["how"] == "built" and doc["as_of"] == as_of, doc  # the same date (the key also holds the recipe)
                steps[side].append((times[side][-1], doc.get("steps", {})))

            raw = work / f"raw{i}"
            raw.mkdir()
            subprocess.run(["cp", "-al", str(warm / "cache" / "uv"), str(raw / "cache")], check=True)
            uv_env = clean_env(UV_NO_CONFIG="1", UV_CACHE_DIR=str(raw / "cache"), UV_PYTHON_DOWNLOADS="never")
            venv = raw / "env"
            vpy = str(venv / "bin" / "python")
            raw_argvs = {
                # The recipe's request (`python = "3.11"`), as one would type it: uv finds the
                # interpreter, as the store must before it can compute the key.
                "venv": [str(uv), "venv", "--relocatable", "--python", request, "--python-preference",
                         args.python_preference, str(venv), "-q"],
                "resolve": [str(uv), "pip", "compile", str(reqs), "-o", str(raw / "lock"), "--generate-hashes",
                            "--exclude-newer", as_of, "--index-url", index_url, "--python", vpy, "--no-header", "-q"],
                "install": [str(uv), "pip", "install", "--require-hashes", "--no-deps", "-r", str(raw / "lock"),
                            "--index-url", index_url, "--python", vpy, "--link-mode", "copy", "-q"],
                # The store's pycs: unchecked-hash, on every core (uv's --compile-bytecode writes
                # timestamp pycs, which are not reproducible; see bench/README.md).
                "bytecode": [vpy, "-m", "compileall", "-q", "-j", str(jobs), "--invalidation-mode", "unchecked-hash",
                             str(venv / "lib")],
            }
            if verify:
                raw_argvs["verify"] = list(verify)  # found on PATH, venv/bin first, as the store runs it
            verify_env = {**clean_env(VIRTUAL_ENV=str(venv)), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
            raw_steps = {}
            t = time.perf_counter()
            for name, argv in raw_argvs.items():
                s0 = time.perf_counter()
                subprocess.run(argv, check=True, env=verify_env if name == "verify" else uv_env,
                               stdout=subprocess.DEVNULL)
                raw_steps[name] = round(time.perf_counter() - s0, 3)
            times["raw"].append(time.perf_counter() - t)
            steps["raw"].append((times["raw"][-1], raw_steps))
            if i == 0:  # peak RSS of the same commands once more, on a fresh copy, outside the timing
                again = work / "raw-rss"
                subprocess.run(["cp", "-al", str(warm / "cache" / "uv"), str(again)], check=True)
                rss_env = {**uv_env, "UV_CACHE_DIR": str(again)}
                shutil.rmtree(venv)
                raw_rss.append(max(peak_rss_mb(argv, env=verify_env if name == "verify" else rss_env) or 0.0
                                   for name, argv in raw_argvs.items()))

        med = statistics.median
        result = {
            "recipe": str(args.recipe),
            "env_size_mb": round(manifest["size"] / 1e6, 1),
            "env_files": manifest["files"],
            "hit_cli_ms": round(med(hit_t) * 1e3, 1),
            "bare_python_ms": round(med(bare_t) * 1e3, 1),
            "hit_ratio": round(med(hit_t) / med(bare_t), 2),
            "hit_library_ms": round(med(lib_t) * 1e3, 2),
            "cold_build_s": round(med(times["cold_as_of"]), 3),
            "cold_build_lookup_s": round(med(times["cold_lookup"]), 3),
            "raw_uv_s": round(med(times["raw"]), 3),
            "cold_ratio": round(med(times["cold_as_of"]) / med(times["raw"]), 3),
            "cold_ratio_lookup": round(med(times["cold_lookup"]) / med(times["raw"]), 3),
            # Per round (each store build beside the baseline run right after it), then the median:
            # steadier than a ratio of medians when the machine's load swings between rounds.
            "cold_ratio_paired": round(med([a / b for a, b in zip(times["cold_as_of"], times["raw"])]), 3),
            "cold_ratio_lookup_paired": round(med([a / b for a, b in zip(times["cold_lookup"], times["raw"])]), 3),
            "cold_steps_s": {k: sorted(v, key=lambda x: x[0])[len(v) // 2][1] for k, v in steps.items()},
            "cold_times_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
            "peak_rss_mb": {"hit": hit_rss, "bare_python": bare_rss, "cold_build": round(max(cold_rss), 1),
                            "raw_uv": round(max(raw_rss), 1)},
            "runs": {"hits": args.hits, "colds": args.colds},
        }
        print(f"recipe {args.recipe.name}: environment {result['env_size_mb']} MB, {result['env_files']} files")
        print(f"(a) cache-hit build (CLI)   {result['hit_cli_ms']:8.1f} ms   python -c pass {result['bare_python_ms']:6.1f} ms"
              f"   ratio {result['hit_ratio']:.2f}  (goal <= 3)")
        print(f"    cache-hit build (library call, in process) {result['hit_library_ms']:.2f} ms")
        print(f"(b) cold build, as_of fixed {result['cold_build_s']:8.3f} s    same work by hand {result['raw_uv_s']:6.3f} s"
              f"    ratio {result['cold_ratio']:.3f} (goal <= 1.10)")
        print(f"    cold build, date looked up {result['cold_build_lookup_s']:6.3f} s    ratio {result['cold_ratio_lookup']:.3f}")
        print(f"    median of per-round ratios: as_of fixed {result['cold_ratio_paired']:.3f}, "
              f"date looked up {result['cold_ratio_lookup_paired']:.3f}")
        for k, v in result["cold_steps_s"].items():
            print(f"    steps of the median run, {k}: " + ", ".join(f"{n} {x:.2f}s" for n, x in v.items()))
        rss = result["peak_rss_mb"]
        print(f"peak RSS: hit {rss['hit']} MB (python -c pass {rss['bare_python']} MB), cold build {rss['cold_build']} MB "
              f"(raw uv {rss['raw_uv']} MB)")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "build.json").write_text(json.dumps(result, indent=2) + "\n")
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
