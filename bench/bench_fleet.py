"""Benchmark a fleet's hot path — pulling an environment from a binary cache — against what moves
the same bytes without the store, side by side (bench/harness.py: alternating fresh processes,
medians, median of per-round ratios, load, peak RSS of the command alone, CPU seconds with every
child).

A builder store builds RECIPE (full: bench/recipes/transformers.toml from PyPI; --quick: a tiny
recipe from a loopback index) and its neighbouring version, pushes both (format 2: shared blobs)
and the first as a format-1 archive to file:// caches under WORK/served, which one HTTP server
serves: nginx when it is installed (Debian: nginx-light), else a Python ThreadingHTTPServer — the
document says which (the Python server's per-request cost counts against the pull only). All
destinations are under --work: the rows measure the disk it is on, whose file system is reported.
Rows:
  pull vs curl|zstd|tar   `llmgw-store pull KEY` into an empty, initialised store (a fleet node
                          has one; made outside the timing) against `curl URL | zstd -d | tar -x` of
                          the same environment's format-1 archive from the same server (issue 25:
                          <= 1.3x wall); CPU ratio beside
  pull (format 1)         the same pull from the format-1 archive, against the same pipe
  push                    `llmgw-store push` (format 2) to a new file:// cache against
                          `tar -c | zstd` of the same tree into a file
  cold build vs pull      `llmgw-store build RECIPE` into an empty store with an empty uv cache
                          against the pull (the fleet's point: >= 5x)
  delta pull              the node that holds RECIPE pulls the neighbour: bytes fetched against the
                          neighbour's full object (< 25 %)

    python bench/bench_fleet.py --work /var/tmp/fleet-bench [--rounds 3] [--out DIR]   # full run (PyPI)
    python bench/bench_fleet.py --work /var/tmp/fleet-bench --pull-only [--rounds 5]   # pull rows only
    python bench/bench_fleet.py --quick --out DIR                                        # the test suite's
--pull-only reuses what a full run left in the same --work (WORK/fleet-state.json): the loop to
iterate on pull's speed. Needs curl and zstd.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cli, packages, store_json, uv_bin
from harness import Bench, BenchError, Side, add_common_args, du_bytes, rmtree

NGINX_CONF = """daemon off;
master_process on;
worker_processes auto;
{user}
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    default_type application/octet-stream;
    types {{ application/json json; }}
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
    }}
}}
"""


class Server:
    """`directory` over HTTP on 127.0.0.1: nginx where installed, else Python's server."""

    def __init__(self, directory: Path, scratch: Path) -> None:
        self.proc: subprocess.Popen | None = None
        self.srv: ThreadingHTTPServer | None = None
        nginx = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
        if nginx:
            self.what = self._nginx(nginx, directory, scratch)
        else:
            self.what = ("Python ThreadingHTTPServer (nginx not installed; Debian: apt-get install nginx-light): "
                         "its per-request cost counts against the pull, not the single-file pipe")
            self._python(directory)

    def _nginx(self, nginx: str, directory: Path, scratch: Path) -> str:
        d = scratch / "nginx"
        d.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:  # a free port (nginx binds it a moment later)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        conf = d / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=d, port=port, root=directory,
                                          user="user root;" if os.geteuid() == 0 else ""))
        self.proc = subprocess.Popen([nginx, "-e", str(d / "error.log"), "-p", str(d), "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"nginx exited {self.proc.returncode}: {self.proc.stderr.read().decode()[-500:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        else:
            self.stop()
            raise BenchError("nginx did not listen within 10 s")
        self.url = f"http://127.0.0.1:{port}"
        version = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1]
        return f"nginx {version} (sendfile, keep-alive)"

    def _python(self, directory: Path) -> None:
        class Quiet(SimpleHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real cache server

            def log_message(self, *args) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.srv is not None:
            self.srv.shutdown()
            self.srv.server_close()


def init_store(root: Path) -> None:
    """An initialised, empty store (its index and directories), as a fleet node has before it pulls."""
    from llmgw_store.core.local_store import Store

    Store.open(root, create=True).close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, rounds=3)
    ap.add_argument("--recipe", type=Path, help="default bench/recipes/transformers.toml (--quick: a tiny recipe)")
    ap.add_argument("--version", help="The recipe's version (default: the recipe's; --quick 1.0).")
    ap.add_argument("--neighbour", help="The neighbouring version for the delta pull (default 4.46.2; --quick 1.1).")
    ap.add_argument("--pull-only", action="store_true",
                    help="Reuse what a full run left in --work; only the pull rows.")
    args = ap.parse_args()
    if args.pull_only and args.work is None:
        raise BenchError("--pull-only needs the --work of an earlier full run")
    for tool in ("curl", "zstd", "tar"):
        if not shutil.which(tool):
            raise BenchError(f"{tool} is not installed (the baseline pipe needs curl, zstd and tar)")
    with Bench("fleet-pull" if args.pull_only else "fleet", args) as bench:
        state_file = bench.work / "fleet-state.json"
        if args.pull_only and not state_file.is_file():
            raise BenchError(f"{bench.work} holds no full run (no {state_file.name}): run once without "
                             f"--pull-only and with --work {bench.work}")
        transformers = REPO / "bench" / "recipes" / "transformers.toml"
        # the recipe's packages stay served through the rows: the cold-build row builds it again
        with (nullcontext() if args.pull_only else
              packages(bench.work, bench.quick, args.recipe, transformers, tiny_extra="")) as pk:
            if pk is None:
                state = json.loads(state_file.read_text())
            else:
                state = prepare(bench, args, pk)
                state_file.write_text(json.dumps(state, indent=2) + "\n")
            server = Server(bench.work / "served", bench.work)
            try:
                bench.note(f"served by {server.what}")
                pull_rows(bench, state, server.url, full=not args.pull_only, index_args=pk.index_args if pk else [])
            finally:
                server.stop()
        bench.finish()


def prepare(bench: Bench, args, pk) -> dict:
    """Build, push: the caches the pull rows read (kept in --work for --pull-only)."""
    work = bench.work
    for d in ("builder", "served", "keys"):
        rmtree(work / d)
    recipe, extra = pk.recipe, pk.index_args
    tiny = pk.tiny is not None and recipe == pk.tiny
    version = args.version or ("1.0" if tiny else None)
    neighbour = args.neighbour or ("1.1" if tiny else "4.46.2")
    builder = work / "builder"
    vargs = ["--version", version] if version else []
    a, cold = store_json(bench.meter, builder, "build", recipe, "--uv", uv_bin(), *extra, *vargs)
    b, warm = store_json(bench.meter, builder, "build", recipe, "--uv", uv_bin(), *extra, "--version", neighbour)
    subprocess.run(cli(builder, "keygen", "bench", "--out", work / "keys"), check=True, capture_output=True)
    secret = str(work / "keys" / "bench.secret")
    served = work / "served"
    for path, fmt in ((a["path"], "2"), (b["path"], "2"), (a["path"], "1")):
        subprocess.run(cli(builder, "push", path, "--to", f"file://{served}/v{fmt}", "--secret-key", secret,
                           "--format", fmt), check=True, capture_output=True)
    state = {"recipe": str(recipe), "extra": extra, "version": version, "neighbour": neighbour,
             "a": {"key": a["key"], "path": a["path"]}, "b": {"key": b["key"], "path": b["path"]},
             "public": str(work / "keys" / "bench.public"), "archive": f"v1/{a['key']}.tar.zst",
             "builds_s": {"cold": round(cold.wall_s, 3), "warm_neighbour": round(warm.wall_s, 3)}}
    return state


def pull_rows(bench: Bench, state: dict, url: str, *, full: bool, index_args: list[str]) -> None:
    work = bench.work
    key, public = state["a"]["key"], state["public"]
    nodes = work / "nodes"
    rmtree(nodes)
    nodes.mkdir()
    archive = work / "served" / state["archive"]
    manifest = json.loads((Path(state["a"]["path"]) / ".llmgw" / "manifest.json").read_text())
    expect = manifest.get("content_hash")

    def pull_argv(fmt):
        def argv(i):
            dest = nodes / f"pull{fmt}-{i}"
            rmtree(dest)
            init_store(dest)
            return cli(dest, "--json", "pull", key, "--from", f"{url}/v{fmt}", "--trusted-key", public)
        return argv

    def pull_after(fmt):
        def after(i, run):
            doc = json.loads(run.stdout)
            got = Path(doc.get("path") or nodes / f"pull{fmt}-{i}" / "store" / Path(state["a"]["path"]).name)
            if not got.is_dir():
                raise BenchError(f"pull reported {doc} but {got} is not there")
            out = {"disk_env_bytes": du_bytes(got),
                   **{k: doc[k] for k in ("bytes_fetched", "bytes_reused") if k in doc}}
            rmtree(nodes / f"pull{fmt}-{i}")
            return out
        return after

    def pipe_argv(i):
        dest = nodes / f"pipe-{i}"
        rmtree(dest)
        dest.mkdir()
        return ["/bin/bash", "-c", "set -o pipefail; curl -sf \"$1\" | zstd -d -q | tar -x -C \"$2\"", "pipe",
                f"{url}/{state['archive']}", str(dest)]

    def pipe_after(i, _run):
        out = {"disk_env_bytes": du_bytes(nodes / f"pipe-{i}")}
        rmtree(nodes / f"pipe-{i}")
        return out

    pipe_name = "curl | zstd -d | tar -x"
    note = (f"{manifest.get('size', 0) / 1e6:.0f} MB in {manifest.get('files')} entries; format-1 archive "
            f"{archive.stat().st_size / 1e6:.1f} MB; content hash {expect}")
    bench.compare("pull", Side("llmgw-store pull (format 2)", pull_argv(2), after=pull_after(2)),
                  [Side(pipe_name, pipe_argv, after=pipe_after)], goal=("<=", 1.3), note=note,
                  names=[f"pull vs {pipe_name}"])
    bench.compare("pull (format 1)", Side("llmgw-store pull (format 1)", pull_argv(1), after=pull_after(1)),
                  [Side(pipe_name, pipe_argv, after=pipe_after)], names=[f"pull (format 1) vs {pipe_name}"])
    if not full:
        return
    builder = work / "builder"
    secret = str(work / "keys" / "bench.secret")

    def push_argv(i):
        dest = work / "push" / f"c{i}"
        rmtree(dest)
        return cli(builder, "--json", "push", state["a"]["path"], "--to", f"file://{dest}", "--secret-key", secret)

    def tar_argv(i):
        dest = work / "push" / f"t{i}.tar.zst"
        dest.parent.mkdir(exist_ok=True)
        dest.unlink(missing_ok=True)
        return ["/bin/bash", "-c", 'set -o pipefail; tar -C "$1" -cf - . | zstd -q -o "$2"', "tar",
                state["a"]["path"], str(dest)]

    bench.compare("push", Side("llmgw-store push (format 2)", push_argv), [Side("tar -c | zstd", tar_argv)],
                  names=["push vs tar -c | zstd"])
    cold_rows(bench, state, pull_argv(2), pull_after(2), index_args)
    # delta: a node holding A pulls the neighbour B
    full_b = json.loads((work / "served" / "v2" / f"{state['b']['key']}.json").read_text()).get("blobs_csize")
    node = nodes / "delta"
    init_store(node)
    subprocess.run(cli(node, "pull", key, "--from", f"{url}/v2", "--trusted-key", public), check=True,
                   capture_output=True)
    run = bench.meter.run(cli(node, "--json", "pull", state["b"]["key"], "--from", f"{url}/v2",
                              "--trusted-key", public))
    delta = json.loads(run.stdout)
    bench.figure(f"delta pull of the neighbour ({state['neighbour']}): bytes fetched vs its full object",
                 delta.get("bytes_fetched"), "bytes", "full object (compressed blobs)", full_b, goal=("<=", 0.25),
                 detail={"wall_s": round(run.wall_s, 3), "rss_mib": run.rss_mib,
                         "bytes_reused": delta.get("bytes_reused"),
                         "builds_s": state.get("builds_s")})


def cold_rows(bench: Bench, state: dict, pull_argv, pull_after, extra: list[str]) -> None:
    """cold build (empty store, empty uv cache) against the pull, alternating (the index the
    builder used: the same key)."""
    vargs = ["--version", state["version"]] if state.get("version") else []

    def build_argv(i):
        root = bench.work / "nodes" / f"cold-{i}"
        rmtree(root)
        return cli(root, "--json", "build", state["recipe"], "--uv", uv_bin(), *extra, *vargs)

    def build_after(i, run):
        if json.loads(run.stdout).get("key") != state["a"]["key"]:
            raise BenchError("the cold build made another key than the pushed one")
        rmtree(bench.work / "nodes" / f"cold-{i}")

    r = bench.compare("cold build", Side("llmgw-store build (cold: empty store and uv cache)", build_argv,
                                         after=build_after),
                      [Side("llmgw-store pull (format 2)", pull_argv, after=pull_after)], goal=(">=", 5),
                      names=["cold build vs pull"])
    r[0]["note"] = "the fleet's point: a node pulls instead of building"


if __name__ == "__main__":
    main()
