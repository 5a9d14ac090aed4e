"""GitHub-style releases on 127.0.0.1: `GET /repos/{owner}/{repo}/releases/tags/{tag}` answers the
assets with `browser_download_url` and, unless withheld, a `digest` of `sha256:<hex>`, as GitHub's
API does; `GET /download/{tag}/{name}` serves the bytes (other bytes, when tampered). Names are
percent-encoded in the URL, so a hostile name (`../x`, `a\n`) is served as a hostile API would."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote


class ReleaseServer:
    def __init__(self) -> None:
        self.releases: dict[tuple[str, str], dict[str, bytes]] = {}
        self.no_digest: set[str] = set()
        self.tampered: set[str] = set()
        self.digests: dict[str, str] = {}  # name -> the `digest` published instead of the true one
        self.urls: dict[str, str] = {}  # name -> the `browser_download_url` published instead
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def base(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo: str, tag: str, name: str, data: bytes) -> str:
        self.releases.setdefault((repo, tag), {})[name] = data
        return hashlib.sha256(data).hexdigest()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            head = False

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not self.head:
                    self.wfile.write(body)

            def do_HEAD(self) -> None:
                self.head = True
                self.do_GET()

            def do_GET(self) -> None:
                m = re.fullmatch(r"/repos/([^/]+/[^/]+)/releases/tags/([^/]+)", self.path)
                if m:
                    assets = srv.releases.get((m.group(1), m.group(2)))
                    if assets is None:
                        return self._send(404, b'{"message": "Not Found"}')
                    doc = {"tag_name": m.group(2), "assets": [
                        {"name": name, "browser_download_url": srv.urls.get(
                            name, f"{srv.base}/download/{m.group(2)}/{quote(name, safe='')}"),
                         **({} if name in srv.no_digest else
                            {"digest": srv.digests.get(name, "sha256:" + hashlib.sha256(data).hexdigest())})}
                        for name, data in assets.items()]}
                    return self._send(200, json.dumps(doc).encode())
                m = re.fullmatch(r"/download/([^/]+)/([^/]+)", self.path)
                name = unquote(m.group(2)) if m else None
                for (_, tag), assets in srv.releases.items():
                    if m and tag == m.group(1) and name in assets:
                        data = assets[name]
                        if name in srv.tampered:
                            data = data + b"\0"
                        return self._send(200, data, "application/octet-stream")
                self._send(404, b"not found", "text/plain")

        return Handler
