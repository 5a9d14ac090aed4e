"""A plain HTTP object store on 127.0.0.1 for binary-cache tests: GET and HEAD read, PUT writes
(unless read-only), every request counted."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ObjectServer:
    def __init__(self, writable: bool = True) -> None:
        self.objects: dict[str, bytes] = {}
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
                data = srv.objects.get(self._key())
                self._reply(404, b"", head) if data is None else self._reply(200, data, head)

            def do_HEAD(self) -> None:
                self.do_GET(head=True)

            def do_PUT(self) -> None:
                srv.requests.append(("PUT", self.path))
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not srv.writable:
                    return self._reply(405)
                srv.objects[self._key()] = body
                self._reply(201)

        return Handler
