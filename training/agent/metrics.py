"""The trainer's per-step metrics (its JSONL file), forwarded to the dashboard in batches."""

import json
import threading
import time
from pathlib import Path

from training.metric_fields import wire_point

from .dashboard import Api


def to_point(record: dict) -> dict:
    return wire_point({"time": time.time(), **record})


class MetricsForwarder:
    """Forwards the trainer's JSONL from where it left off; the watch loop and the uploader both call it."""

    def __init__(self, api: Api, path: Path, max_points: int):
        self.api, self.path, self.max_points = api, path, max_points
        self.position = 0
        self._lock = threading.Lock()

    def flush(self) -> None:
        with self._lock:
            self.position = forward_metrics(self.api, self.path, self.position, self.max_points)


def forward_metrics(api: Api, path: Path, position: int, max_points: int) -> int:
    """Sends the trainer's new JSONL lines in batches; returns how far the file has been read."""
    if not path.exists():
        return position
    with open(path, "rb") as f:
        f.seek(position)
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]  # a half-written last line waits for the next round
    points = [to_point(json.loads(line)) for line in complete.splitlines() if line.strip()]
    for start in range(0, len(points), max_points):
        api.call("POST", "metrics", {"points": points[start:start + max_points]})
    return position + len(complete)
