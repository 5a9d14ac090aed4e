"""A plain HTTP object store on 127.0.0.1 for binary-cache tests: GET and HEAD read, PUT and DELETE
write (unless read-only), `GET <dir>/` lists a folder as nginx's `autoindex_format json` does (what
cache gc reads), every request counted."""

from __future__ import annotations

import email.utils
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ObjectServer:
    def __init__(self, writable: bool = True) -> None:
        self.objects: dict[str, bytes] = {}
        self.mtimes: dict[str, float] = {}
        self.writable = writable
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/cache"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _key(self) -> str:
                return self.path.removeprefix("/cache/")

            def _reply(self, status: int, body: bytes = b"", head: bool = False) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_GET(self, head: bool = False) -> None:
                srv.requests.append((self.command, self.path))
                if self.path.endswith("/"):
                    return self._listing(head)
                data = srv.objects.get(self._key())
                self._reply(404, b"", head) if data is None else self._reply(200, data, head)

            def _listing(self, head: bool) -> None:
                folder = self._key().rstrip("/")
                prefix = f"{folder}/" if folder and folder != "/cache" else ""
                items = []
                for key, data in sorted(srv.objects.items()):
                    if key.startswith(prefix) and "/" not in key[len(prefix):]:
                        items.append({"name": key[len(prefix):], "type": "file", "size": len(data),
                                      "mtime": email.utils.formatdate(srv.mtimes[key], usegmt=True)})
                    elif key.startswith(prefix):
                        sub = key[len(prefix):].split("/")[0]
                        if not any(i["name"] == sub for i in items):
                            items.append({"name": sub, "type": "directory", "mtime": email.utils.formatdate(usegmt=True)})
                self._reply(200, json.dumps(items).encode(), head)

            def do_DELETE(self) -> None:
                srv.requests.append(("DELETE", self.path))
                if not srv.writable:
                    return self._reply(405)
                found = srv.objects.pop(self._key(), None)
                srv.mtimes.pop(self._key(), None)
                self._reply(404 if found is None else 204)

            def do_HEAD(self) -> None:
                self.do_GET(head=True)

            def do_PUT(self) -> None:
                srv.requests.append(("PUT", self.path))
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not srv.writable:
                    return self._reply(405)
                srv.objects[self._key()] = body
                srv.mtimes[self._key()] = time.time()
                self._reply(201)

        return Handler
