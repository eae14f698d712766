"""Metrics sinks: the JSONL file, and the HTTP poster that batches, retries and never blocks a step."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from training.metrics import HttpSink, JsonlSink


@pytest.fixture
def endpoint():
    received, failures = [], {"left": 2}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if failures["left"] > 0:  # the first two posts fail: the poster must retry them
                failures["left"] -= 1
                self.send_response(503)
            else:
                received.append(body["records"])
                self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics", received
    server.shutdown()


def test_it_posts_batches_and_retries_failures(endpoint):
    url, received = endpoint
    sink = HttpSink(url, batch_size=4, flush_seconds=0.2)
    for step in range(10):
        sink.emit({"step": step})
    sink.close()
    assert [r["step"] for batch in received for r in batch] == list(range(10))
    assert max(len(batch) for batch in received) <= 4 and sink.dropped == 0


def test_it_never_blocks_a_step_when_the_endpoint_is_down():
    sink = HttpSink("http://127.0.0.1:9/metrics", batch_size=2, flush_seconds=0.05, timeout_seconds=0.2,
                    attempts=2, max_queue=5)
    start = time.monotonic()
    for step in range(100):
        sink.emit({"step": step})
    assert time.monotonic() - start < 0.1
    sink.close(timeout_seconds=3)
    assert sink.dropped >= 90 and sink.sent == 0


def test_the_jsonl_sink_appends_one_record_a_line(tmp_path):
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.emit({"step": 1, "loss": 2.5})
    sink.emit({"step": 2, "loss": 2.0})
    sink.close()
    assert [json.loads(line)["step"] for line in open(tmp_path / "m.jsonl")] == [1, 2]
