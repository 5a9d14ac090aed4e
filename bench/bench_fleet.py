"""Benchmark a fleet's hot path: pulling an environment from a binary cache, against its baselines.

One run, side by side (all over HTTP from one local server where a network is involved):
  cold build     `llmgw-store build RECIPE` into an empty store (empty uv cache)
  warm build     a neighbouring version (`--neighbour`, default 4.46.2) built in the same store
                 afterwards (uv's cache warm: what a builder pays for an upgrade)
  push           `llmgw-store push` of the environment (format 2: blobs) to a file:// cache
  pull           `llmgw-store pull` into an empty store, from the cache served over HTTP
  curl|zstd|tar  `curl URL | zstd -d | tar -x` of the same environment's format-1 archive, from the
                 same server: the floor for moving these bytes
  delta pull     the node that pulled RECIPE pulls the neighbour: bytes fetched vs its full object
Each with wall seconds and peak RSS (wait4's ru_maxrss of the command and its children), and the
ratios the issue asks for: cold build / pull (goal >= 5), pull / curl|zstd|tar (goal <= 1.3),
delta bytes / full object (goal < 25 %).

    .venv/bin/python bench/bench_fleet.py [--recipe bench/recipes/transformers.toml] [--neighbour 4.46.2]
    .venv/bin/python bench/bench_fleet.py --work /dev/shm/fleet-bench     # keeps builds and caches
    .venv/bin/python bench/bench_fleet.py --work /dev/shm/fleet-bench --pull-only [--repeat 3]
The second form reuses the caches a full run left in --work and times only pull against
curl|zstd|tar (best of --repeat; each pull into a new store, initialised before the clock starts,
as a fleet node's is): the loop to iterate on pull's speed.

Needs PyPI (the recipe resolves there), curl and zstd. The machine is shared: figures are noisy.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CLI, REPO

CPU: dict[str, float] = {}  # step -> CPU seconds (user + system) of the command and its children


def run(argv: list[str], *, shell: bool = False) -> tuple[float, int, str]:
    """(wall seconds, peak RSS in MiB of the command and its children, stdout) of one command; its
    CPU seconds go to CPU["last"] (on a shared machine CPU time is steadier than wall time)."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            executable="/bin/bash" if shell else None)
    out, err = [], []
    readers = [threading.Thread(target=lambda s=s, b=b: b.append(s.read())) for s, b in
               ((proc.stdout, out), (proc.stderr, err))]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t
    CPU["last"] = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {argv}\n{''.join(err)[-3000:]}")
    return seconds, usage.ru_maxrss // 1024, "".join(out)


def serve(directory: Path) -> tuple[ThreadingHTTPServer, str]:
    class Quiet(SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: what a real cache server does

        def log_message(self, *args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=REPO / "bench" / "recipes" / "transformers.toml")
    ap.add_argument("--neighbour", default="4.46.2", help="The neighbouring version for the warm build and delta pull.")
    ap.add_argument("--work", type=Path, help="Keep everything here (default: a temporary directory, removed).")
    ap.add_argument("--pull-only", action="store_true",
                    help="Reuse the caches of an earlier full run in --work; time only pull and curl|zstd|tar.")
    ap.add_argument("--repeat", type=int, default=3, help="With --pull-only: runs of each, the best kept.")
    args = ap.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = "only-system"
    from uv import find_uv_bin

    uv = find_uv_bin()
    work = args.work or Path(tempfile.mkdtemp(prefix="llmgw-bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    cli = [str(CLI)]
    rows: list[tuple[str, float, int, str]] = []
    cpu: list[float] = []

    def record(what: str, seconds: float, rss: int, note: str) -> None:
        rows.append((what, seconds, rss, note))
        cpu.append(CPU["last"])
    if args.pull_only:
        return pull_only(work, cli, max(1, args.repeat))
    try:
        builder = work / "builder"
        t, rss, out = run(cli + ["--root", str(builder), "--json", "build", str(args.recipe), "--uv", uv])
        a = json.loads(out)
        record("cold build", t, rss, a["path"].rsplit("/", 1)[1])
        t, rss, out = run(cli + ["--root", str(builder), "--json", "build", str(args.recipe), "--uv", uv,
                                 "--version", args.neighbour])
        b = json.loads(out)
        record(f"warm build ({args.neighbour})", t, rss, b["path"].rsplit("/", 1)[1])
        run(cli + ["--root", str(builder), "keygen", "bench", "--out", str(work / "keys")])
        secret, public = str(work / "keys" / "bench.secret"), str(work / "keys" / "bench.public")
        served = work / "served"
        t, rss, out = run(cli + ["--root", str(builder), "--json", "push", a["path"], "--to", f"file://{served}/v2",
                                 "--secret-key", secret])
        record("push (format 2)", t, rss, f"{json.loads(out)['bytes_uploaded'] / 1e6:.0f} MB uploaded")
        run(cli + ["--root", str(builder), "push", b["path"], "--to", f"file://{served}/v2", "--secret-key", secret])
        run(cli + ["--root", str(builder), "push", a["path"], "--to", f"file://{served}/v1", "--secret-key", secret,
                   "--format", "1"])
        srv, url = serve(served)
        try:
            full_a = json.loads((served / "v2" / f"{a['key']}.json").read_text())["blobs_csize"]
            full_b = json.loads((served / "v2" / f"{b['key']}.json").read_text())["blobs_csize"]
            archive = served / "v1" / f"{a['key']}.tar.zst"
            node = work / "node"
            t, rss, out = run(cli + ["--root", str(node), "--json", "-v", "pull", a["key"], "--from", f"{url}/v2",
                                     "--trusted-key", public])
            pulled = json.loads(out)
            pull_t, pull_cpu = t, CPU["last"]
            phases = ", ".join(f"{k} {v:.2f}s" for k, v in (pulled.get("phases") or {}).items())
            record("pull (format 2, HTTP)", t, rss, f"{pulled['bytes_fetched'] / 1e6:.0f} MB fetched; {phases}")
            (work / "raw").mkdir()
            t, rss, _ = run(f"curl -sf {url}/v1/{archive.name} | zstd -d -q | tar -x -C {work / 'raw'}", shell=True)
            raw_t, raw_cpu = t, CPU["last"]
            record("curl | zstd -d | tar -x", t, rss, f"{archive.stat().st_size / 1e6:.0f} MB archive")
            t, rss, out = run(cli + ["--root", str(work / "node-v1"), "--json", "pull", a["key"], "--from",
                                     f"{url}/v1", "--trusted-key", public])
            record("pull (format 1, HTTP)", t, rss, "one archive, for comparison")
            t, rss, out = run(cli + ["--root", str(node), "--json", "pull", b["key"], "--from", f"{url}/v2",
                                     "--trusted-key", public])
            delta = json.loads(out)
            record(f"delta pull ({args.neighbour})", t, rss,
                         f"{delta['bytes_fetched'] / 1e6:.1f} MB fetched of {full_b / 1e6:.0f} MB "
                         f"({100 * delta['bytes_fetched'] / full_b:.1f} %), {delta['bytes_reused'] / 1e6:.0f} MB reused")
        finally:
            srv.shutdown()
        size = json.loads((Path(a["path"]) / ".llmgw" / "manifest.json").read_text())
        print(f"{args.recipe.name}: {size['size'] / 1e6:.0f} MB in {size['files']} entries; format-2 object "
              f"{full_a / 1e6:.0f} MB, format-1 archive {archive.stat().st_size / 1e6:.0f} MB")
        print(f"{'step':32} {'seconds':>8} {'CPU s':>7} {'peak RSS':>9}  notes")
        for (what, secs, rss, note), c in zip(rows, cpu):
            print(f"{what:32} {secs:8.2f} {c:7.2f} {rss:6d} MiB  {note}")
        cold = rows[0][1]
        print(f"cold build / pull        {cold / pull_t:6.1f}x  (goal >= 5)")
        print(f"pull / curl|zstd|tar     {pull_t / raw_t:6.2f}   (goal <= 1.3; in CPU seconds {pull_cpu / raw_cpu:.2f})")
        print(f"delta / full object      {100 * delta['bytes_fetched'] / full_b:6.1f} %  (goal < 25 %)")
    finally:
        if args.work is None:
            subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
            shutil.rmtree(work, ignore_errors=True)


def pull_only(work: Path, cli: list[str], repeat: int) -> None:
    """pull vs curl|zstd|tar from the caches a full run left in `work`; best of `repeat`, wall and CPU."""
    served, public = work / "served", str(work / "keys" / "bench.public")
    if not (served / "v1").is_dir():
        raise SystemExit(f"{work} holds no caches: run once without --pull-only and with --work {work}")
    archive = max((served / "v1").glob("*.tar.zst"), key=lambda p: p.stat().st_size)
    key = archive.name[:32]
    srv, url = serve(served)
    best: dict[str, tuple[float, float]] = {}
    try:
        for i in range(repeat):
            for what in ("pull", "raw"):
                dest = work / f"pull-only-{what}"
                if dest.exists():
                    subprocess.run(["chmod", "-R", "u+w", str(dest)], check=True)
                    shutil.rmtree(dest)
                if what == "pull":
                    # An initialised, empty store (a fleet node has one): its creation (the index
                    # and its migrations) is not what is compared with tar.
                    run(cli + ["--root", str(dest), "gc", "--dry-run"])
                    t, rss, out = run(cli + ["--root", str(dest), "--json", "pull", key, "--from", f"{url}/v2",
                                             "--trusted-key", public])
                    phases = json.loads(out).get("phases") or {}
                    print(f"pull {i + 1}: {t:.2f}s, {CPU['last']:.2f} CPU s, {rss} MiB; "
                          + ", ".join(f"{k} {v:.2f}s" for k, v in phases.items()))
                else:
                    dest.mkdir()
                    t, rss, _ = run(f"curl -sf {url}/v1/{archive.name} | zstd -d -q | tar -x -C {dest}", shell=True)
                    print(f"curl|zstd|tar {i + 1}: {t:.2f}s, {CPU['last']:.2f} CPU s, {rss} MiB")
                old = best.get(what)
                best[what] = (min(t, old[0]) if old else t, min(CPU["last"], old[1]) if old else CPU["last"])
    finally:
        srv.shutdown()
    (pt, pc), (rt, rc) = best["pull"], best["raw"]
    print(f"best of {repeat}: pull {pt:.2f}s ({pc:.2f} CPU s), curl|zstd|tar {rt:.2f}s ({rc:.2f} CPU s)")
    print(f"pull / curl|zstd|tar     {pt / rt:6.2f}   (goal <= 1.3; in CPU seconds {pc / rc:.2f})")


if __name__ == "__main__":
    main()
