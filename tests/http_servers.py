"""The small HTTP servers tests stand up on 127.0.0.1 (a hub's API, a dashboard, a checkpoint store): a handler base
that answers with a body and keeps quiet, and `serving`, which runs one on a free port for a with block."""

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    def answer(self, status: int, body=b"") -> None:
        """`body` as the response: bytes as they are, anything else as JSON."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        if not isinstance(body, bytes):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextmanager
def serving(handler, **attributes):
    """A ThreadingHTTPServer of `handler` on a free port, `attributes` set on it (the handlers read them as
    self.server.NAME), shut down and closed after the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attributes.items():
        setattr(server, name, value)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
