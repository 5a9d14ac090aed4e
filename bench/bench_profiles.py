"""Benchmark `activate` and `rollback` wall time against a bare interpreter start, side by side.

Builds two small environments from a package index on 127.0.0.1 (offline), then times, interleaved
N times each: `python -c pass`, `llmgw-store activate p <path>` (a new generation each time) and
`llmgw-store rollback p` (back to the previous one). Medians and ratios.

    .venv/bin/python bench/bench_profiles.py [--runs 30]
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from common import CLI, PY, timed  # noqa: E402
sys.path.insert(0, str(REPO))

from tests.support.index_server import PackageIndex  # noqa: E402
from tests.support.wheels import build_wheel  # noqa: E402




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = "only-system"
    from uv import find_uv_bin

    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-prof-"))
    index = PackageIndex()
    try:
        for name, version, date in [("tinydep", "1.0", "2024-01-01"), ("tinydep", "2.0", "2024-06-01"),
                                    ("tinyengine", "1.0", "2024-02-01")]:
            reqs = ("tinydep",) if name == "tinyengine" else ()
            scripts = {"tinyengine": "tinyengine:main"} if name == "tinyengine" else None
            index.add(name, build_wheel(work / "wheels", name, version, requires=reqs, scripts=scripts), date + "T00:00:00Z")
        index.start()
        recipe = work / "tiny.toml"
        recipe.write_text(
            '[engine]\nname = "tinyengine"\nbinary = "tinyengine"\n\n[[build]]\nvariant = "cpu"\n'
            f'python = "{sys.version_info.major}.{sys.version_info.minor}"\nversion = "1.0"\n'
            'requirements = ["tinyengine=={version}"]\n'
        )
        root = work / "root"
        base = [str(CLI), "--root", str(root)]
        paths = []
        for as_of in ("2024-02-02", "2024-06-02"):
            out = subprocess.run(base + ["--json", "build", str(recipe), "--index-url", index.url, "--uv",
                                         find_uv_bin(), "--as-of", as_of], check=True, capture_output=True, text=True)
            paths.append(json.loads(out.stdout)["path"])
        subprocess.run(base + ["activate", "p", paths[0]], check=True, capture_output=True)
        bare, act, back = [], [], []
        for _ in range(args.runs):
            # each round: a new generation for paths[1], then a rollback to the one for paths[0]
            bare.append(timed([str(PY), "-c", "pass"]))
            act.append(timed(base + ["activate", "p", paths[1]]))
            back.append(timed(base + ["rollback", "p"]))
        med = statistics.median
        b = med(bare)
        print(f"python -c pass     {b * 1e3:7.1f} ms")
        print(f"activate           {med(act) * 1e3:7.1f} ms   ratio {med(act) / b:.2f} (goal <= 3)")
        print(f"rollback           {med(back) * 1e3:7.1f} ms   ratio {med(back) / b:.2f} (goal <= 3)")
    finally:
        index.stop()
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
