"""Where per-step metrics go. A sink has emit(record) and close(); the JSONL file is always on, the HTTP poster when
the recipe names a URL (the dashboard's, later). Neither may hold a training step up for long."""

import json
import logging
import queue
import threading
import time

_log = logging.getLogger(__name__)


class JsonlSink:
    def __init__(self, path):
        self.file = open(path, "a", buffering=1)

    def emit(self, record):
        self.file.write(json.dumps(record) + "\n")

    def close(self):
        self.file.close()


class HttpSink:
    """Posts records in batches ({"records": [...]}) from a background thread, retrying with backoff.

    emit() only enqueues; when the queue is full (the endpoint is down for long) the oldest records are dropped and
    counted, so a dead dashboard never stalls training. close() flushes within a time budget."""

    def __init__(self, url, batch_size=50, flush_seconds=2.0, timeout_seconds=5.0, attempts=4, max_queue=10_000,
                 headers=None):
        import httpx

        self.url, self.batch_size, self.flush_seconds, self.attempts = url, batch_size, flush_seconds, attempts
        self.client = httpx.Client(timeout=timeout_seconds, headers=headers)
        self.queue = queue.Queue(maxsize=max_queue)
        self.dropped = 0
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)
        self._thread.start()

    def emit(self, record):
        while True:
            try:
                self.queue.put_nowait(record)
                return
            except queue.Full:
                try:
                    self.queue.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def _take_batch(self):
        batch = []
        deadline = time.monotonic() + self.flush_seconds
        while len(batch) < self.batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self._stop.is_set() and self.queue.empty()):
                break
            try:
                batch.append(self.queue.get(timeout=min(remaining, 0.05)))
            except queue.Empty:
                continue
        return batch

    def _post(self, batch):
        for attempt in range(self.attempts):
            try:
                response = self.client.post(self.url, json={"records": batch})
                if response.status_code < 500 and response.status_code != 429:
                    if response.status_code >= 400:
                        _log.warning("metrics endpoint refused a batch: HTTP %s", response.status_code)
                    else:
                        self.sent += len(batch)
                    return
            except Exception as exc:  # noqa: BLE001 - network errors are retried, never raised into training
                _log.debug("metrics post failed: %s", exc)
            time.sleep(0.1 if self._stop.is_set() else min(0.5 * 2 ** attempt, 8.0))
        self.dropped += len(batch)

    def _run(self):
        while not (self._stop.is_set() and self.queue.empty()):
            batch = self._take_batch()
            if batch:
                self._post(batch)

    def close(self, timeout_seconds=10.0):
        self._stop.set()
        self._thread.join(timeout_seconds)
        self.client.close()


def open_sinks(config):
    sinks = [JsonlSink(config["jsonl"])]
    if config.get("http"):
        sinks.append(HttpSink(config["http"]))
    return sinks
