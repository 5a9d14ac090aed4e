"""A minor upgrade on a fleet node: the node holds RECIPE at VERSION and pulls NEIGHBOUR (format 2).
Prints, per round, the delta pull's wall and CPU seconds, the bytes it fetched, reused and reused
without reading them (stamped), and the bytes fetched against the object's compressed size.

Not a baseline comparison (no bench/harness.py row): the figures of issue 31, one pull at a time,
measured by the harness's Meter. A builder store under WORK builds both versions once (kept for later runs); each CLI given with
--cli (default: this checkout's) pushes both to its own file:// cache WORK/cache-<i> (its packing;
kept for later runs: delete it after changing the packing) and, each
round, pulls VERSION into a new node store (not timed: it stamps what it writes) and then
NEIGHBOUR (timed; --cold: with the first one's files out of the page cache). Compare two checkouts by giving both CLIs:

    python bench/bench_delta.py --work /var/tmp/delta-bench --cli /work/main/.venv/bin/llmgw-store \\
        --cli .venv/bin/llmgw-store --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, Meter


def run(cli: str, root: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([cli, "--root", str(root), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{cli} {' '.join(args)[:200]}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def timed(meter: Meter, cli: str, root: Path, *args: str) -> tuple[dict, float, float]:
    """The command's --json document, wall and CPU seconds (bench/harness.py measures)."""
    got = meter.run([cli, "--root", str(root), "--json", *args])
    if got.code != 0:
        sys.exit(f"{cli} {' '.join(args)[:200]}: exit {got.code}: {got.stderr[-2000:]}")
    return json.loads(got.stdout), got.wall_s, got.cpu_s if got.cpu_s is not None else got.cpu_waited_s


def evict(tree: Path) -> None:
    """Drop the page-cache pages of every regular file below `tree` (only those: no global drop);
    written back first (dirty pages cannot be dropped)."""
    os.sync()
    for dirpath, _, names in os.walk(tree):
        for n in names:
            try:
                fd = os.open(os.path.join(dirpath, n), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--cli", action="append", help="llmgw-store executables to compare (default: this checkout's)")
    ap.add_argument("--recipe", type=Path, default=REPO / "bench" / "recipes" / "transformers.toml")
    ap.add_argument("--version", default="4.46.3")
    ap.add_argument("--neighbour", default="4.47.0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true",
                    help="evict the node's store files from the page cache before the timed pull (posix_fadvise "
                         "DONTNEED: a node whose older environment was pulled days ago)")
    args = ap.parse_args()
    clis = args.cli or [str(Path(sys.executable).parent / "llmgw-store")]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    builder = work / "builder"
    from uv import find_uv_bin

    built = {}
    for v in (args.version, args.neighbour):
        out = work / f"build-{v}.json"
        if not out.is_file():
            out.write_text(run(clis[-1], builder, "--json", "build", str(args.recipe), "--uv", find_uv_bin(),
                               "--version", v).stdout)
        built[v] = json.loads(out.read_text())
    a, b = built[args.version], built[args.neighbour]
    keys = work / "keys"
    if not (keys / "bench.secret").is_file():
        run(clis[-1], builder, "keygen", "bench", "--out", str(keys))
    meter = Meter()
    print(f"{a['name']} -> {b['name']}; {args.rounds} rounds, load {os.getloadavg()[0]:.1f}; {meter.launcher}")
    caches = []
    for i, cli in enumerate(clis):
        cache = work / f"cache-{i}"
        if not all((cache / f"{x['key']}.json").is_file() for x in (a, b)):  # kept: an older CLI may not open
            shutil.rmtree(cache, ignore_errors=True)                           # the builder once a newer one has
            for p in (a["path"], b["path"]):
                run(cli, builder, "push", p, "--to", f"file://{cache}", "--secret-key", str(keys / "bench.secret"))
        caches.append((cache, json.loads((cache / f"{b['key']}.json").read_text())["blobs_csize"]))
    rows: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(clis))}
    for r in range(args.rounds):
        order = list(range(len(clis)))
        order = order[r % len(order):] + order[:r % len(order)]  # alternating, as bench/harness.py does
        for i in order:
            cli, (cache, whole) = clis[i], caches[i]
            node = work / "nodes" / f"{i}-{r}"
            shutil.rmtree(node, ignore_errors=True)
            pull = ("pull", "--from", f"file://{cache}", "--trusted-key", str(keys / "bench.public"))
            run(cli, node, pull[0], a["key"], *pull[1:])
            if args.cold:
                evict(node / "store")
            doc, wall, cpu = timed(meter, cli, node, pull[0], b["key"], *pull[1:])
            rows[i].append((wall, cpu))
            print(f"  {cli} round {r + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU; fetched {doc['bytes_fetched'] / 2**20:.2f}"
                  f" MiB = {100 * doc['bytes_fetched'] / whole:.1f} % of the object ({whole / 2**20:.2f} MiB); reused "
                  f"{doc['bytes_reused'] / 2**20:.1f} MiB, {doc.get('bytes_reused_stamped', 0) / 2**20:.1f} MiB of it "
                  f"not read; phases {doc.get('phases')}")
            shutil.rmtree(node, ignore_errors=True)
    for i, cli in enumerate(clis):
        print(f"{cli}: median {statistics.median(w for w, _ in rows[i]):.2f} s wall, "
              f"{statistics.median(c for _, c in rows[i]):.2f} s CPU (load {os.getloadavg()[0]:.1f} at the end)")

if __name__ == "__main__":
    main()
