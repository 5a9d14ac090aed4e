"""Benchmark pulling an environment from a binary cache, side by side with its baselines.

Builds RECIPE (default bench/recipes/transformers.toml, ~200 MB) on a "builder" store, pushes it to
a file:// cache, then on fresh "node" stores times, interleaved, R times each:
  (a) `llmgw-store pull` of it,
  (b) a cold `llmgw-store build` of the same recipe (empty caches: what a node without a cache does),
  (c) `tar --zstd -xf` of the same archive into a directory (the floor for fetching these bytes).
Reports medians and the ratios build/pull (goal >= 5) and pull/tar (goal <= 1.3).

    .venv/bin/python bench/bench_fleet.py [--recipe ...] [--runs 3]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CLI, REPO, timed  # noqa: E402




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=REPO / "bench" / "recipes" / "transformers.toml")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = "only-system"
    from uv import find_uv_bin

    uv = find_uv_bin()
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-fleet-"))
    try:
        builder = work / "builder"
        doc = json.loads(subprocess.run([str(CLI), "--root", str(builder), "--json", "build", str(args.recipe), "--uv", uv],
                                        check=True, capture_output=True, text=True).stdout)
        subprocess.run([str(CLI), "--root", str(builder), "keygen", "bench", "--out", str(work / "keys")], check=True,
                       capture_output=True)
        cache = work / "cache"
        subprocess.run([str(CLI), "--root", str(builder), "push", doc["path"], "--to", f"file://{cache}",
                        "--secret-key", str(work / "keys" / "bench.secret")], check=True, capture_output=True)
        archive = next(cache.glob("*.tar.zst"))
        pull_t, build_t, tar_t = [], [], []
        for i in range(args.runs):
            pull_t.append(timed([str(CLI), "--root", str(work / f"pull{i}"), "pull", doc["key"], "--from", f"file://{cache}",
                                 "--trusted-key", str(work / "keys" / "bench.public")]))
            build_t.append(timed([str(CLI), "--root", str(work / f"build{i}"), "build", str(args.recipe), "--uv", uv]))
            (work / f"tar{i}").mkdir()
            tar_t.append(timed(["tar", "--zstd", "-xf", str(archive), "-C", str(work / f"tar{i}")]))
        med = statistics.median
        size = json.loads((Path(doc["path"]) / ".llmgw" / "manifest.json").read_text())["size"]
        print(f"{args.recipe.name}: {size / 1e6:.0f} MB, archive {archive.stat().st_size / 1e6:.0f} MB (zstd -3)")
        print(f"(a) pull {med(pull_t):.2f} s   (b) cold build {med(build_t):.2f} s   (c) tar --zstd -x {med(tar_t):.2f} s")
        print(f"build/pull {med(build_t) / med(pull_t):.1f}x (goal >= 5)   pull/tar {med(pull_t) / med(tar_t):.2f} (goal <= 1.3)")
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
