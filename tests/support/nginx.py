"""The documented nginx (docs/fleet.md's one ```nginx block, "Serving a cache with nginx", only its
paths and port replaced) as a binary cache on 127.0.0.1: the `start_nginx` fixture of the modules
that run a fleet through it (test_nginx_cache.py, test_fleet_month.py, test_releases.py,
test_release_fleet.py). Its password file holds the builder and each node of NODES, each with its
own password."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"
PASSWORD = "s3cret-builder"
AUTH = {"LLMGW_STORE_CACHE_AUTH": f"builder-1:{PASSWORD}"}
NODES = {"node-1": "s3cret-node-1", "node-2": "s3cret-node-2", "node-3": "s3cret-node-3"}  # the password file's nodes

WRAPPER = """
worker_processes 1;
pid {tmp}/nginx.pid;
{user}
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
    types {{ application/json json; }}
    default_type application/octet-stream;
    proxy_temp_path {tmp}/proxy-tmp;
    fastcgi_temp_path {tmp}/fastcgi-tmp;
    uwsgi_temp_path {tmp}/uwsgi-tmp;
    scgi_temp_path {tmp}/scgi-tmp;
{server}
}}
"""


def documented_server() -> str:
    """The one ```nginx block of docs/fleet.md: the configuration users are told to deploy."""
    blocks = re.findall(r"```nginx\n(.*?)```", DOCS.read_text(), re.S)
    assert len(blocks) == 1, "docs/fleet.md must hold exactly one nginx configuration"
    return blocks[0]


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_nginx(tmp_path):
    started: list[subprocess.Popen] = []

    def start(edit=lambda conf: conf) -> SimpleNamespace:
        base = tmp_path / f"nginx-{len(started)}"
        srv = base / "srv"
        (srv / ".tmp").mkdir(parents=True)
        (srv / "llmgw").mkdir()
        htpasswd = base / "writers.htpasswd"
        htpasswd.write_text(f"builder-1:{{PLAIN}}{PASSWORD}\n"
                            + "".join(f"{n}:{{PLAIN}}{p}\n" for n, p in NODES.items()))
        port = _free_port()
        server = documented_server()
        for fixed in ("listen 80;", "/srv/llmgw-cache", "/etc/nginx/llmgw-writers.htpasswd"):
            assert fixed in server, f"the documented configuration no longer says {fixed!r}: update this test"
        server = (server.replace("listen 80;", f"listen 127.0.0.1:{port};").replace("/srv/llmgw-cache", str(srv))
                  .replace("/etc/nginx/llmgw-writers.htpasswd", str(htpasswd)))
        conf = base / "nginx.conf"
        conf.write_text(WRAPPER.format(tmp=base, user="user root;" if os.geteuid() == 0 else "",
                                       server=edit(server)))

        def launch() -> subprocess.Popen:
            proc = subprocess.Popen([NGINX, "-p", str(base), "-c", str(conf), "-e", str(base / "error.log"),
                                     "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    preexec_fn=_die_with_parent)
            started.append(proc)
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return proc
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log = (base / "error.log").read_text() if (base / "error.log").exists() else ""
                        raise AssertionError(f"nginx did not start: {proc.stderr.read().decode()} {log}") from None
                    time.sleep(0.05)

        def stop() -> None:
            """nginx's fast shutdown (SIGTERM): open connections closed, the port refused until `launch`."""
            proc = started[-1]
            proc.terminate()
            proc.wait(30)

        launch()
        return SimpleNamespace(url=f"http://127.0.0.1:{port}/llmgw", host="127.0.0.1", files=srv / "llmgw",
                               error_log=base / "error.log", stop=stop, restart=launch)

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
