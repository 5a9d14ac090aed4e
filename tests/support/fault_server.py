"""A binary cache over HTTP on 127.0.0.1 that fails the way real networks do: it serves a directory
(what a `file://` push wrote, or what PUTs write through it) and injects faults into requests.

    srv = FaultyCache(tmp_path / "cache", rate=0.1, faults=("503", "reset", "truncate"), seed=1)
    srv = FaultyCache(dir, rules=[(r"\\.json$", "drip")])    # every metadata document drips
    ...
    srv.counts        # fault -> how many requests it hit
    srv.stop()

Faults:
    503        HTTP 503 with `Retry-After: 0`
    500        HTTP 500
    drop       the connection closed without an answer
    reset      headers and half the body, then a TCP reset
    truncate   headers declaring the whole length, half the body, then a clean close
    stall      headers and half the body, then nothing (until the client gives up or the server stops)
    drip       the body one byte every `drip_s` seconds
    redirect   307 to the same object under /alias/ on this server (the same origin)
    offsite    307 to the same object on `offsite` (another origin: a redirect the store refuses)
    down       headers and half the body, then a TCP reset, and the server goes down: it closes its
               listening socket (new connections are refused) and resets every request on the
               connections it had, until the test calls `come_back()` (the same port again): a
               restart whose length the test decides (`went_down` is set when it happens)

`read_pace_s`: a PUT's body is read a MiB per that many seconds (a slow uplink).

`rules` (regex over the request path, fault[, how many times]) apply to the matching requests (all of
them, or the first n); `rate` picks one of
`faults` at random for a share of the others (GET and HEAD only, unless `writes`). Range requests
are answered (206) unless `ranges=False`. The listing of `prefix/<folder>/` is nginx's
`autoindex_format json`, as cache gc reads it.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PREFIX = "/cache/"
ALIAS = "/alias/"


class FaultyCache:
    def __init__(self, root: Path, *, rate: float = 0.0, faults: tuple[str, ...] = ("503",), seed: int = 0,
                 rules: list[tuple] | None = None, ranges: bool = True, writes: bool = False,
                 drip_s: float = 1.0, offsite: str | None = None, read_pace_s: float = 0.0):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rate, self.faults = rate, tuple(faults)
        self.rules = [[re.compile(r[0]), r[1], r[2] if len(r) > 2 else None] for r in (rules or [])]
        self.ranges, self.writes, self.drip_s, self.offsite = ranges, writes, drip_s, offsite
        self.read_pace_s = read_pace_s  # > 0: a PUT's body is read a MiB per this many seconds
        self.counts: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []
        self.ranged = 0  # GETs that asked for a range (a read resumed where it stopped)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.down = False
        self.went_down = threading.Event()
        self._listen(("127.0.0.1", 0))

    @property
    def origin(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        return self.origin + PREFIX.rstrip("/")

    def _listen(self, address) -> None:
        self._server = ThreadingHTTPServer(address, self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def go_down(self) -> None:
        """Stop listening (connections are refused) and reset requests on open connections."""
        with self._lock:
            if self.down:
                return
            self.down = True
        self._server.shutdown()
        self._server.server_close()
        self.went_down.set()

    def come_back(self) -> None:
        """Listen again on the same port, and answer as before."""
        address = self._server.server_address
        with self._lock:
            self.down = False
        self._listen(address)

    def stop(self) -> None:
        self._stopping.set()
        if not self.down:
            self._server.shutdown()
            self._server.server_close()

    def _fault(self, method: str, path: str) -> str | None:
        with self._lock:
            for rule in self.rules:
                pattern, fault, left = rule
                if pattern.search(path) and left != 0:
                    if left is not None:
                        rule[2] = left - 1
                    return fault
        if method not in ("GET", "HEAD") and not self.writes:
            return None
        with self._lock:
            if self.rate and self._rng.random() < self.rate:
                return self._rng.choice(self.faults)
        return None

    def _count(self, fault: str) -> None:
        with self._lock:
            self.counts[fault] = self.counts.get(fault, 0) + 1

    def _handler(self):
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _name(self) -> str | None:
                for prefix in (PREFIX, ALIAS):
                    if self.path.startswith(prefix):
                        return self.path[len(prefix):]
                return None

            def _body(self, length: int) -> bytes:
                """A request's body; with `read_pace_s`, taken a MiB at a time at that pace, through
                a small receive buffer (so the sender's progress is the pace)."""
                if not srv.read_pace_s:
                    return self.rfile.read(length)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
                body = bytearray()
                while len(body) < length and not srv._stopping.is_set():
                    piece = self.rfile.read(min(1 << 20, length - len(body)))
                    if not piece:
                        break
                    body += piece
                    time.sleep(srv.read_pace_s)
                return bytes(body)

            def _file(self, name: str) -> Path | None:
                if ".." in name.split("/") or name.startswith("/"):
                    return None
                return srv.root / name

            def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                       head: bool = False) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _hang_up(self, reset: bool) -> None:
                self.wfile.flush()
                self.close_connection = True
                if reset:  # RST instead of FIN: the reader sees "connection reset by peer"
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()

            def _body_fault(self, fault: str, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                half = body[: len(body) // 2]
                if fault == "drip":
                    for i in range(len(body)):
                        if srv._stopping.wait(srv.drip_s):
                            break
                        self.wfile.write(body[i:i + 1])
                        self.wfile.flush()
                    return
                self.wfile.write(half)
                if fault == "stall":
                    self.wfile.flush()
                    srv._stopping.wait(120)
                self._hang_up(reset=fault == "reset")

            def _answer(self, head: bool) -> None:
                name = self._name()
                srv.requests.append((self.command, self.path))
                if srv.down:
                    return self._hang_up(reset=True)
                if name is None:
                    return self._reply(404, head=head)
                fault = srv._fault(self.command, self.path)
                if fault:
                    srv._count(fault)
                if fault == "drop":
                    return self._hang_up(reset=False)
                if fault in ("503", "500"):
                    return self._reply(int(fault), b"injected", {"Retry-After": "0"}, head)
                if fault in ("redirect", "offsite") and not self.path.startswith(ALIAS):
                    where = (srv.offsite or srv.origin + PREFIX.rstrip("/")) + "/" + name if fault == "offsite" \
                        else ALIAS + name
                    return self._reply(307, b"", {"Location": where}, head)
                if name.endswith("/") or name == "":
                    body, headers, status = self._listing(name.rstrip("/")), {}, 200
                    if body is None:
                        return self._reply(404, head=head)
                else:
                    path = self._file(name)
                    if path is None or not path.is_file():
                        return self._reply(404, head=head)
                    body, status = path.read_bytes(), 200
                    headers = {}
                    ask = self.headers.get("Range", "")
                    m = re.fullmatch(r"bytes=(\d+)-", ask)
                    if m:
                        srv.ranged += 1
                    if m and srv.ranges and int(m.group(1)) < len(body):
                        start = int(m.group(1))
                        headers = {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"}
                        body, status = body[start:], 206
                if head:
                    return self._reply(status, body, headers, head=True)
                if fault in ("reset", "truncate", "stall", "drip"):
                    return self._body_fault(fault, status, body, headers)
                if fault == "down":
                    srv.go_down()
                    return self._body_fault("reset", status, body, headers)
                self._reply(status, body, headers)

            def _listing(self, folder: str) -> bytes | None:
                d = srv.root / folder if folder else srv.root
                if not d.is_dir():
                    return None
                items = []
                for e in sorted(os.scandir(d), key=lambda e: e.name):
                    st = e.stat()
                    items.append({"name": e.name, "type": "directory" if e.is_dir() else "file",
                                  "mtime": email.utils.formatdate(st.st_mtime, usegmt=True), "size": st.st_size})
                return json.dumps(items).encode()

            def do_GET(self) -> None:
                self._answer(head=False)

            def do_HEAD(self) -> None:
                self._answer(head=True)

            def do_PUT(self) -> None:
                srv.requests.append(("PUT", self.path))
                body = self._body(int(self.headers.get("Content-Length", 0)))
                if srv.down:
                    return self._hang_up(reset=True)
                fault = srv._fault("PUT", self.path)
                if fault:
                    srv._count(fault)
                    if fault == "drop":
                        return self._hang_up(reset=False)
                    if fault in ("reset", "truncate", "stall", "drip"):
                        return self._hang_up(reset=True)
                    return self._reply(int(fault) if fault.isdigit() else 503, b"injected", {"Retry-After": "0"})
                name = self._name()
                path = self._file(name) if name else None
                if path is None:
                    return self._reply(404)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
                tmp.write_bytes(body)
                os.replace(tmp, path)
                self._reply(201)

            def do_DELETE(self) -> None:
                srv.requests.append(("DELETE", self.path))
                if srv.down:
                    return self._hang_up(reset=True)
                fault = srv._fault("DELETE", self.path)
                if fault:
                    srv._count(fault)
                    return self._reply(503, b"injected", {"Retry-After": "0"})
                name = self._name()
                path = self._file(name) if name else None
                if path is None or not path.is_file():
                    return self._reply(404)
                path.unlink()
                self._reply(204)

        return Handler

