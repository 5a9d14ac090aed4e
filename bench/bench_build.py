"""Benchmark `llmgw-store build` against its baselines, side by side in one run.

(a) cache hit: `llmgw-store build RECIPE` of a key already in the store, against a bare interpreter
    start (`python -c pass` with the same python), interleaved, N runs each; medians and ratio.
(b) cold build: a fresh store building RECIPE, against the same uv commands run by hand (uv venv,
    uv pip compile --generate-hashes --exclude-newer, uv pip install --require-hashes --no-deps
    --link-mode copy --compile-bytecode) on the same requirements. Both start from a copy of one warm
    uv cache, use the same uv binary and uv's default thread counts (bytecode is compiled on every
    core on both sides), so the ratio is llmgw-store's own cost, not the network's. Interleaved, R
    runs each; medians, ratio, and the median build's steps (the JSON's `steps`).
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

        # (b) cold build vs the same uv commands by hand, each from a copy of the warm uv cache.
        python = manifest["python"]["path"]
        as_of = manifest["exclude_newer"]
        index_url = manifest["index_url"]
        reqs = work / "requirements.in"
        reqs.write_text("".join(r + "\n" for r in manifest["requirements"]))
        cold_t, raw_t, cold_rss, raw_rss, cold_steps = [], [], [0.0], [0.0], []
        for i in range(args.colds):
            root = work / f"cold{i}"
            (root / "cache").mkdir(parents=True)
            subprocess.run(["cp", "-al", str(warm / "cache" / "uv"), str(root / "cache" / "uv")], check=True)
            out_file = work / f"cold{i}.json"
            rss_file = work / f"cold{i}.rss"
            t = time.perf_counter()
            with open(out_file, "w") as out:
                # GNU time (a small parent) measures the peak RSS; its own cost is a millisecond.
                subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(rss_file), str(CLI), "--root", str(root),
                                "--json", "build", str(args.recipe), "--uv", str(uv)], stdout=out,
                               stderr=subprocess.DEVNULL, check=True)
            cold_t.append(time.perf_counter() - t)
            cold_rss.append(int(rss_file.read_text().split()[-1]) / 1024)
            doc = json.loads(out_file.read_text())
            assert doc["how"] == "built", doc
            cold_steps.append((cold_t[-1], doc.get("steps", {})))

            raw = work / f"raw{i}"
            raw.mkdir()
            subprocess.run(["cp", "-al", str(warm / "cache" / "uv"), str(raw / "cache")], check=True)
            uv_env = clean_env(UV_NO_CONFIG="1", UV_CACHE_DIR=str(raw / "cache"), UV_PYTHON_DOWNLOADS="never")
            venv = raw / "env"
            raw_argvs = [
                [str(uv), "venv", "--relocatable", "--python", python, str(venv), "-q"],
                [str(uv), "pip", "compile", str(reqs), "-o", str(raw / "lock"), "--generate-hashes", "--exclude-newer",
                 as_of, "--index-url", index_url, "--python", str(venv / "bin" / "python"), "--no-header", "-q"],
                [str(uv), "pip", "install", "--require-hashes", "--no-deps", "-r", str(raw / "lock"), "--index-url",
                 index_url, "--python", str(venv / "bin" / "python"), "--link-mode", "copy", "--compile-bytecode",
                 "-q"],
            ]
            t = time.perf_counter()
            for argv in raw_argvs:
                subprocess.run(argv, check=True, env=uv_env)
            raw_t.append(time.perf_counter() - t)
            if i == 0:  # peak RSS of the same commands once more, on a fresh copy, outside the timing
                again = work / "raw-rss"
                subprocess.run(["cp", "-al", str(warm / "cache" / "uv"), str(again)], check=True)
                rss_env = {**uv_env, "UV_CACHE_DIR": str(again)}
                shutil.rmtree(venv)
                raw_rss.append(max(peak_rss_mb(argv, env=rss_env) or 0.0 for argv in raw_argvs))

        med = statistics.median
        result = {
            "recipe": str(args.recipe),
            "env_size_mb": round(manifest["size"] / 1e6, 1),
            "env_files": manifest["files"],
            "hit_cli_ms": round(med(hit_t) * 1e3, 1),
            "bare_python_ms": round(med(bare_t) * 1e3, 1),
            "hit_ratio": round(med(hit_t) / med(bare_t), 2),
            "hit_library_ms": round(med(lib_t) * 1e3, 2),
            "cold_build_s": round(med(cold_t), 3),
            "raw_uv_s": round(med(raw_t), 3),
            "cold_ratio": round(med(cold_t) / med(raw_t), 3),
            "cold_steps_s": sorted(cold_steps, key=lambda x: x[0])[len(cold_steps) // 2][1],
            "peak_rss_mb": {"hit": hit_rss, "bare_python": bare_rss, "cold_build": round(max(cold_rss), 1),
                            "raw_uv": round(max(raw_rss), 1)},
            "runs": {"hits": args.hits, "colds": args.colds},
        }
        print(f"recipe {args.recipe.name}: environment {result['env_size_mb']} MB, {result['env_files']} files")
        print(f"(a) cache-hit build (CLI)   {result['hit_cli_ms']:8.1f} ms   python -c pass {result['bare_python_ms']:6.1f} ms"
              f"   ratio {result['hit_ratio']:.2f}  (goal <= 3)")
        print(f"    cache-hit build (library call, in process) {result['hit_library_ms']:.2f} ms")
        print(f"(b) cold build              {result['cold_build_s']:8.3f} s    raw uv by hand {result['raw_uv_s']:6.3f} s"
              f"    ratio {result['cold_ratio']:.3f} (goal <= 1.10)")
        print("    cold build steps (median run): "
              + ", ".join(f"{k} {v:.2f}s" for k, v in result["cold_steps_s"].items()))
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
