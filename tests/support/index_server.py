"""A package index on 127.0.0.1 for tests: PEP 503 HTML and PEP 691 JSON with `upload-time`, files
with their sha256, HEAD supported, every request counted; `PackageIndex(upload_times=False)` serves
no `upload-time`, as PyTorch's index. `tamper(filename)` makes it serve other
bytes than the ones whose digest it publishes, as a compromised mirror would; `slow(seconds, when)`
makes it wait that long before answering a file download while `when()` holds, as a slow mirror
would (a uv that is installing then stays alive long enough to be caught). `require_auth(user,
password)` makes it a private mirror (HTTP 401 without that basic auth; `refused` counts them);
`hold_downloads()` parks every file download until the test opens the returned barrier;
`unavailable(times, pattern)` answers HTTP 503 (`Retry-After: 0`) to the next `times` requests
whose path matches `pattern` (None: to all of them), as a mirror restarting or overloaded does;
`unavailable_served` counts those answers."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Release:
    project: str
    filename: str
    data: bytes
    uploaded: datetime
    sha256: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha256 = hashlib.sha256(self.data).hexdigest()


class PackageIndex:
    def __init__(self, *, upload_times: bool = True) -> None:
        # upload_times=False: the JSON lists no `upload-time`, as PyTorch's index (uv issue 16846).
        self.upload_times = upload_times
        self.releases: dict[str, list[Release]] = {}
        self.tampered: set[str] = set()
        self.file_delay = 0.0
        self.delay_when: Callable[[], bool] = lambda: True
        self.requests: list[tuple[str, str]] = []
        self.auth: str | None = None  # the Authorization header a private mirror accepts
        self.refused = 0
        self.held: tuple[threading.Event, threading.Event] | None = None
        self.outage: list | None = None  # [compiled pattern, how many left (None: all)]
        self.unavailable_served = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/simple"

    def start(self) -> PackageIndex:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, project: str, wheel: Path, uploaded: str) -> Release:
        rel = Release(project, wheel.name, wheel.read_bytes(),
                      datetime.fromisoformat(uploaded.replace("Z", "+00:00")).astimezone(UTC))
        self.releases.setdefault(normalize(project), []).append(rel)
        return rel

    def tamper(self, filename: str) -> None:
        self.tampered.add(filename)

    def slow(self, seconds: float, when: Callable[[], bool] | None = None) -> None:
        self.file_delay = seconds
        self.delay_when = when or (lambda: True)

    def require_auth(self, username: str, password: str) -> None:
        self.auth = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

    def hold_downloads(self) -> tuple[threading.Event, threading.Event]:
        """(reached, go): a file download sets `reached` and waits (at most 120 s) for `go`."""
        self.held = (threading.Event(), threading.Event())
        return self.held

    def unavailable(self, times: int | None, pattern: str = r"^/simple/") -> None:
        self.outage = [re.compile(pattern), times]

    def _down_for(self, path: str) -> bool:
        with self._lock:
            if self.outage is None or not self.outage[0].search(path) or self.outage[1] == 0:
                return False
            if self.outage[1] is not None:
                self.outage[1] -= 1
            self.unavailable_served += 1
            return True

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()

    def _find(self, filename: str) -> Release | None:
        for rels in self.releases.values():
            for rel in rels:
                if rel.filename == filename:
                    return rel
        return None

    def _handler(self):
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _send(self, status: int, ctype: str, body: bytes, head: bool) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _serve(self, head: bool) -> None:
                with index._lock:
                    index.requests.append((self.command, self.path))
                if index.auth is not None and self.headers.get("Authorization") != index.auth:
                    with index._lock:
                        index.refused += 1
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="index"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = self.path.split("?")[0]
                if index._down_for(path):
                    self.send_response(503)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                wants_json = JSON_TYPE in self.headers.get("Accept", "")
                m = re.fullmatch(r"/simple/([^/]+)/?", path)
                if path.rstrip("/") == "/simple":
                    names = sorted(index.releases)
                    if wants_json:
                        body = json.dumps({"meta": {"api-version": "1.1"}, "projects": [{"name": n} for n in names]})
                        return self._send(200, JSON_TYPE, body.encode(), head)
                    links = "".join(f'<a href="{n}/">{n}</a>\n' for n in names)
                    return self._send(200, "text/html", f"<html><body>{links}</body></html>".encode(), head)
                if m:
                    rels = index.releases.get(normalize(m.group(1)))
                    if rels is None:
                        return self._send(404, "text/plain", b"not found", head)
                    if wants_json:
                        doc = {
                            "meta": {"api-version": "1.1"},
                            "name": normalize(m.group(1)),
                            "versions": sorted({r.filename.split("-")[1] for r in rels}),
                            "files": [
                                {
                                    "filename": r.filename,
                                    "url": f"../../files/{r.filename}",
                                    "hashes": {"sha256": r.sha256},
                                    "size": len(r.data),
                                    **({"upload-time": r.uploaded.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
                                       if index.upload_times else {}),
                                }
                                for r in rels
                            ],
                        }
                        return self._send(200, JSON_TYPE, json.dumps(doc).encode(), head)
                    links = "".join(
                        f'<a href="../../files/{html.escape(r.filename)}#sha256={r.sha256}">{html.escape(r.filename)}</a>\n'
                        for r in rels
                    )
                    return self._send(200, "text/html", f"<html><body>{links}</body></html>".encode(), head)
                f = re.fullmatch(r"/files/([^/]+)", path)
                rel = index._find(f.group(1)) if f else None
                if rel is None:
                    return self._send(404, "text/plain", b"not found", head)
                if index.held is not None and not head:
                    index.held[0].set()
                    index.held[1].wait(120)
                if index.file_delay and not head and index.delay_when():
                    time.sleep(index.file_delay)
                data = rel.data
                if rel.filename in index.tampered:
                    data = data[:-1] + bytes([data[-1] ^ 0xFF])
                return self._send(200, "application/octet-stream", data, head)

        return Handler
