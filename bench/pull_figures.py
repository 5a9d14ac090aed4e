"""Issue 33's pull row from the documented nginx: `llmgw-store pull KEY` of a pushed environment
into an empty root (no store, no index: the pull makes them, timed) against
`curl URL | zstd -d | tar -x` of the same environment's format-1 archive from the same nginx (the
pipe baseline of bench_fleet.py), alternating fresh processes, measured by bench/harness.py's Meter
(wall and peak RSS of the command alone by bench/launch.c: for the pipe its largest process; CPU
of every process it starts, by its cgroup). Not one of the harness's benches: the cache is one an
earlier run pushed (bench_delta.py's WORK/cache-0 and its builder), served by docs/fleet.md's nginx
configuration (tests/support/nginx.py's wrapper; reads need no password), not bench_fleet's own.

    /tmp/reg/bin/llmgw-store --root BUILDER push PATH --to file://WORK/v1 --format 1 --secret-key K
    python3 bench/pull_figures.py --cli /tmp/reg/bin/llmgw-store --cache /var/tmp/delta-bench/cache-0 \\
        --archive WORK/v1/KEY.tar.zst --key KEY --trusted-key /var/tmp/delta-bench/keys/bench.public \\
        --work WORK --rounds 7

Prints each round and the medians (wall, CPU, peak RSS), the median of per-round ratios and the
1-minute load at each round; --json OUT keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))
from harness import Meter, rmtree  # noqa: E402

from tests.support.nginx import NGINX, WRAPPER, documented_server  # noqa: E402


def start_nginx(base: Path, cache: Path, archive: Path) -> tuple[subprocess.Popen, str]:
    """docs/fleet.md's server block on a free port; /llmgw is a hard-linked copy of `cache`, with
    the format-1 archive beside it in /llmgw/v1/."""
    srv = base / "srv"
    rmtree(base)
    (srv / ".tmp").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(cache), str(srv / "llmgw")], check=True)
    (srv / "llmgw" / "v1").mkdir()
    os.link(archive, srv / "llmgw" / "v1" / archive.name)
    (base / "writers.htpasswd").write_text("builder-1:{PLAIN}unused\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = (documented_server().replace("listen 80;", f"listen 127.0.0.1:{port};")
              .replace("/srv/llmgw-cache", str(srv))
              .replace("/etc/nginx/llmgw-writers.htpasswd", str(base / "writers.htpasswd")))
    conf = base / "nginx.conf"
    conf.write_text(WRAPPER.format(tmp=base, user="user root;" if os.geteuid() == 0 else "", server=server)
                    .replace(f"access_log {base}/access.log;", "access_log off;"))
    proc = subprocess.Popen([NGINX, "-p", str(base), "-c", str(conf), "-e", str(base / "error.log"),
                             "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/llmgw"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--archive", type=Path, required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--trusted-key", required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    proc, url = start_nginx(work / "nginx", args.cache.resolve(), args.archive.resolve())
    meter = Meter()
    nodes = work / "nodes"

    def pull(i):
        return [args.cli, "--root", str(nodes / f"pull-{i}"), "--json", "pull", args.key, "--from", url,
                "--trusted-key", args.trusted_key]

    def pipe(i):
        (nodes / f"pipe-{i}").mkdir(parents=True)
        return ["/bin/bash", "-c", 'set -o pipefail; curl -sf "$1" | zstd -d -q | tar -x -C "$2"', "pipe",
                f"{url}/v1/{args.archive.name}", str(nodes / f"pipe-{i}")]

    sides = {"pull": pull, "pipe": pipe}
    runs: dict[str, list] = {k: [] for k in sides}
    loads = []
    try:
        rmtree(nodes)
        for k, argv in sides.items():  # warm-up: page cache and bytecode alike
            meter.run(argv(-1))
            rmtree(nodes / f"{k}--1")
        for r in range(args.rounds + 1):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for k in order:
                got = meter.run(sides[k](r))
                runs[k].append((got.wall_s, got.cpu_s if got.cpu_s is not None else got.cpu_waited_s, got.rss_mib))
                rmtree(nodes / f"{k}-{r}")
            loads.append(os.getloadavg()[0])
            p, q = runs["pull"][-1], runs["pipe"][-1]
            print(f"round {r}: pull {p[0]:.3f} s, {p[1]:.3f} CPU-s, {p[2]} MiB; pipe {q[0]:.3f} s, {q[1]:.3f} "
                  f"CPU-s, {q[2]} MiB; load {loads[-1]:.2f}", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
        meter.close()
    del runs["pull"][0], runs["pipe"][0], loads[0]  # round 0: a second warm-up
    med = {k: {"wall_s": statistics.median(x[0] for x in v), "cpu_s": statistics.median(x[1] for x in v),
               "rss_mib_max": max(x[2] for x in v)} for k, v in runs.items()}
    res = {"medians": med,
           "wall_ratio": statistics.median(p[0] / q[0] for p, q in zip(runs["pull"], runs["pipe"], strict=True)),
           "cpu_ratio": statistics.median(p[1] / q[1] for p, q in zip(runs["pull"], runs["pipe"], strict=True)),
           "rss_ratio": med["pull"]["rss_mib_max"] / med["pipe"]["rss_mib_max"],
           "load_min_max": [min(loads), max(loads)], "runs": runs, "launcher": meter.launcher,
           "cpu_accounting": meter.cpu_accounting}
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
