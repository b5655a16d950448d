"""A tiny HTTP receiver on loopback for the HTTP-job tests: it records every request
(headers, body, when) and answers as its test tells it, per path (stdlib only)."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: ``answer(request) -> (status, body)``; it may block (a slow receiver).
Answer = Callable[[dict[str, Any]], tuple[int, bytes]]


class Receiver:
    """Records requests in :attr:`seen`; :attr:`answers` maps a path to its answer
    (default: 200 with a JSON echo of the run's headers)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.seen: list[dict[str, Any]] = []
        self.answers: dict[str, Answer] = {}
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                req = {"method": self.command, "path": self.path, "at": time.time(),
                       "headers": {k.lower(): v for k, v in self.headers.items()},
                       "body": self.rfile.read(size) if size else b""}
                with owner.lock:
                    owner.seen.append(req)
                answer = owner.answers.get(self.path, _echo)
                status, body = answer(req)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Location", "http://elsewhere.invalid/")
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the node went away while we held its request
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def requests(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.seen if r["path"] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _echo(req: dict[str, Any]) -> tuple[int, bytes]:
    h = req["headers"]
    return 200, json.dumps({k: h.get(k) for k in ("raftsched-run-id", "raftsched-fence",
                                                  "raftsched-attempt")}).encode()


__all__ = ["Answer", "Receiver"]
