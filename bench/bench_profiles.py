"""Benchmark `activate` and `rollback` wall time against a bare interpreter start, side by side.

Builds two small environments A and B from a package index on 127.0.0.1 (offline), activates A
(generation 1), then times, interleaved N times each: `python -c pass`, `llmgw-store activate p B`
(from A: a new generation every time, never "already at generation N") and `llmgw-store rollback p
--to 1` (from B back to A: a real switch every time). The script checks after each round that both
commands switched. Medians and ratios, and the peak RSS of each command (one more run under GNU time).

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
from common import CLI, PY, peak_rss_mb, timed  # noqa: E402

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
        link = root / "profiles" / "p"
        for _ in range(args.runs):
            # each round: a new generation for paths[1] (current: paths[0]), then back to generation 1
            for what, argv, times in (("bare", [str(PY), "-c", "pass"], bare),
                                      ("activate", base + ["activate", "p", paths[1]], act),
                                      ("rollback", base + ["rollback", "p", "--to", "1"], back)):
                times.append(timed(argv))
                if what != "bare":
                    want = paths[1] if what == "activate" else paths[0]
                    assert os.path.realpath(link) == want, f"{what} did not switch to {want}"
        # Peak RSS: one more run of each, under GNU time (outside the timed runs).
        rss = {"bare": peak_rss_mb([str(PY), "-c", "pass"]),
               "activate": peak_rss_mb(base + ["activate", "p", paths[1]]),
               "rollback": peak_rss_mb(base + ["rollback", "p", "--to", "1"])}
        med = statistics.median
        b = med(bare)
        print(f"python -c pass     {b * 1e3:7.1f} ms   peak RSS {rss['bare']} MB")
        print(f"activate           {med(act) * 1e3:7.1f} ms   ratio {med(act) / b:.2f} (goal <= 3)   "
              f"peak RSS {rss['activate']} MB")
        print(f"rollback           {med(back) * 1e3:7.1f} ms   ratio {med(back) / b:.2f} (goal <= 3)   "
              f"peak RSS {rss['rollback']} MB")
    finally:
        index.stop()
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
