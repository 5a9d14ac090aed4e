"""A forward HTTP proxy on 127.0.0.1 for plain-http requests (`GET http://host:port/path`), which
records the URL of every request it carries: what the environment's http_proxy leads a client to."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "transfer-encoding", "te", "upgrade"}


class ForwardProxy:
    def __init__(self) -> None:
        self.seen: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _carry(self) -> None:
                proxy.seen.append(self.path)
                target = urlsplit(self.path)
                if target.scheme != "http" or not target.hostname:
                    self.send_error(400, "a forward proxy takes absolute http:// URLs")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=60)
                try:
                    conn.request(self.command, target.path + (f"?{target.query}" if target.query else ""), body=body,
                                 headers={k: v for k, v in self.headers.items() if k.lower() not in HOP})
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP | {"content-length"}:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_DELETE = _carry

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ForwardProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
