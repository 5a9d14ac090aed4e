"""Benchmark verify and optimise, side by side with their baselines.

(a) verify throughput: `verify` of one real environment (default bench/recipes/transformers.toml,
    ~200 MB, ~6,800 entries), against hashing the same files' bytes with blake3 in one pass
    (one thread, read + update, no listing). Ratio = blake3 time / verify time (goal >= 0.8),
    for the library call and for the whole command.
(b) dedup of two environments that share most wheels (the recipe as of two dates a month apart):
    disk cost of the second one (du of the store with both, minus with the first only) as a share of
    its own size, built as is (sharing through the uv cache's hardlinks) and after `optimise`.
(c) optimise of N identical copies of the environment against Nix's `nix-store --optimise` of the
    same trees added to a Nix store (needs Debian's nix-bin), time and share of bytes freed.

    .venv/bin/python bench/bench_integrity.py [--copies 10]
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
from common import CLI, REPO, clone_registered  # noqa: E402



def du(path: Path) -> int:
    return int(subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def cli(root: Path, *args: str) -> dict:
    return json.loads(subprocess.run([str(CLI), "--root", str(root), "--json", *args], check=True, capture_output=True,
                                     text=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=REPO / "bench" / "recipes" / "transformers.toml")
    ap.add_argument("--copies", type=int, default=10)
    args = ap.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = "only-system"
    from uv import find_uv_bin

    uv = find_uv_bin()
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-int-"))
    try:
        root = work / "root"
        first = cli(root, "build", str(args.recipe), "--uv", uv)
        env = Path(first["path"])
        sys.path.insert(0, str(REPO))
        from blake3 import blake3

        from llmgw_store.core.local_store import Store
        from llmgw_store.integrity.verify import check_path

        # (a) verify vs one blake3 pass over the same bytes (page cache warm for both)
        files = [os.path.join(d, f) for d, _, fs in os.walk(env) for f in fs if not os.path.islink(os.path.join(d, f))]
        best_b3 = best_lib = best_cli = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            h = blake3()
            total = 0
            for f in files:
                with open(f, "rb") as fh:
                    data = fh.read()
                total += len(data)
                h.update(data)
            best_b3 = min(best_b3, time.perf_counter() - t)
            with Store.open(root) as store:
                row = store.index.path_by_name(env.name)
                t = time.perf_counter()
                assert check_path(store, row)["ok"]
                best_lib = min(best_lib, time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run([str(CLI), "--root", str(root), "verify", str(env)], check=True, capture_output=True)
            best_cli = min(best_cli, time.perf_counter() - t)
        print(f"(a) verify of {total / 1e6:.0f} MB in {len(files)} files: library {best_lib:.3f} s, command {best_cli:.3f} s; "
              f"blake3 one pass {best_b3:.3f} s -> throughput ratio {best_b3 / best_lib:.2f} (library), "
              f"{best_b3 / best_cli:.2f} (command) (goal >= 0.8)")

        # (b) a second environment sharing most wheels
        store_dir = root / "store"
        du_one = du(store_dir)
        second = cli(root, "build", str(args.recipe), "--uv", uv, "--as-of", _month_later(first["as_of"]))
        size2 = json.loads((Path(second["path"]) / ".llmgw" / "manifest.json").read_text())["size"]
        du_two = du(store_dir)
        opt = cli(root, "optimise")
        du_opt = du(store_dir)
        print(f"(b) second environment ({size2 / 1e6:.0f} MB of files): costs {(du_two - du_one) / 1e6:.1f} MB on disk "
              f"= {100 * (du_two - du_one) / size2:.1f}% as built (uv cache hardlinks), "
              f"{(du_opt - du_one) / 1e6:.1f} MB = {100 * (du_opt - du_one) / size2:.1f}% after optimise "
              f"({opt['files_linked']} files linked) (goal <= 10%)")

        # (c) optimise of N identical copies vs Nix
        croot = work / "copies"
        base = cli(croot, "build", str(args.recipe), "--uv", uv)
        clone_registered(croot, Path(base["path"]).name, args.copies - 1)
        # the copies share nothing: drop the uv cache, whose hardlinks the original shares
        subprocess.run(["rm", "-rf", str(croot / "cache" / "uv")], check=True)
        before = du(croot / "store")
        t = time.perf_counter()
        r = cli(croot, "optimise")
        ours = time.perf_counter() - t
        after = du(croot / "store")
        print(f"(c) llmgw-store optimise of {args.copies} copies ({before / 1e9:.2f} GB): {ours:.1f} s, "
              f"saved {100 * (before - after) / before:.0f}% ({r['files_linked']} files linked)")
        if shutil.which("nix-store"):
            nixroot = work / "nixroot"
            for i, p in enumerate(sorted((croot / "store").glob(f"*-{Path(base['path']).name.split('-', 1)[1]}"))):
                tree = work / f"nixsrc{i}"
                subprocess.run(["cp", "-a", "--no-preserve=links", str(p), str(tree)], check=True)
                subprocess.run(["nix-store", "--store", str(nixroot), "--add-fixed", "--recursive", "sha256", str(tree)],
                               check=True, capture_output=True)
                subprocess.run(["chmod", "-R", "u+w", str(tree)], check=True)
                shutil.rmtree(tree)
            nstore = nixroot / "nix" / "store"
            nbefore = du(nstore)
            t = time.perf_counter()
            subprocess.run(["nix-store", "--store", str(nixroot), "--optimise"], check=True, capture_output=True)
            nix_s = time.perf_counter() - t
            nafter = du(nstore)
            print(f"    nix-store --optimise of the same trees: {nix_s:.1f} s, saved {100 * (nbefore - nafter) / nbefore:.0f}% "
                  f"-> time ratio {ours / nix_s:.2f}")
        else:
            print("    (nix-store not installed: apt-get install nix-bin to compare with Nix)")
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def _month_later(as_of: str) -> str:
    from datetime import datetime, timedelta

    return (datetime.fromisoformat(as_of.replace("Z", "+00:00")) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")


if __name__ == "__main__":
    main()
