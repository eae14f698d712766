"""The trainer's per-step metrics (its JSONL file), forwarded to the dashboard in batches."""

import json
import logging
import threading
import time
from pathlib import Path

from training.metric_fields import ROUTER_LOAD, wire_point

from .dashboard import Api, Refused

log = logging.getLogger(__name__)
TOKEN_REFUSED = (401, 403)  # this box's attempt is over: the heartbeat stops it, the points have nowhere to go
MALFORMED = (400, 422)  # the dashboard's answer to a point it cannot take
# A batch is sent once its lines reach this size too: the router's load matrices make lines of up to a few hundred kB,
# and the dashboard reads a body of at most 2.5 MB (Django's DATA_UPLOAD_MAX_MEMORY_SIZE).
MAX_BATCH_BYTES = 1_500_000


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
    """Sends the trainer's new JSONL lines in batches; returns how far the file has been sent. A dashboard that does
    not answer keeps the rest for the next round; of a batch it refuses, only the points it refuses are dropped
    (`_send`), said in the log, so one bad line never wedges the forwarding."""
    if not path.exists():
        return position
    with open(path, "rb") as f:
        f.seek(position)
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]  # a half-written last line waits for the next round
    batch: list[dict] = []
    sent_to = read_to = position
    for line in complete.splitlines(keepends=True):
        read_to += len(line)
        if batch and read_to - sent_to > MAX_BATCH_BYTES:  # this line would make the batch too big: send it first
            if not _send(api, batch):
                return sent_to
            batch, sent_to = [], read_to - len(line)
        if line.strip():
            try:
                record = json.loads(line)
                if isinstance(record, dict) and record.get("memory_plan"):  # said once, on a process's first step
                    if batch and not _send(api, batch):
                        return sent_to
                    batch, sent_to = [], read_to - len(line)
                    if not _send_event(api, record["memory_plan"]):
                        return sent_to
                batch.append(to_point(record))
            except (ValueError, TypeError, KeyError, OverflowError, OSError):
                log.warning("skipping a metrics line that is not a JSON object: %r", line[:200])
        if len(batch) == max_points:
            if not _send(api, batch):
                return sent_to
            batch, sent_to = [], read_to
    if batch and not _send(api, batch):
        return sent_to
    return read_to


def _send_event(api: Api, message) -> bool:
    """What the trainer said once (its memory plan) posted as the run's log event; False leaves it for the next
    round."""
    try:
        api.call("POST", "events", {"kind": "log", "message": str(message)[:4000]})
    except ConnectionError as exc:
        log.warning("event not sent, kept for the next round: %s", exc)
        return False
    except Refused as exc:
        if exc.status in TOKEN_REFUSED:
            return False
        log.warning("the dashboard refused an event, dropped: %s", exc)
    return True


def _send(api: Api, points: list[dict]) -> bool:
    """Whether the batch is done with (sent, or refused for good); False leaves it for the next round. A batch the
    dashboard refuses as malformed is sent again in halves, so that only the points it refuses are dropped."""
    try:
        api.call("POST", "metrics", {"points": points})
    except ConnectionError as exc:
        log.warning("metrics not sent, kept for the next round: %s", exc)
        return False
    except Refused as exc:
        if exc.status in TOKEN_REFUSED:
            log.warning("metrics not sent: %s", exc)
            return False
        if exc.status in MALFORMED and len(points) > 1:
            middle = len(points) // 2
            return _send(api, points[:middle]) and _send(api, points[middle:])
        if exc.status == 422 and any(ROUTER_LOAD in p for p in points):  # the step without its router matrix
            log.warning("the dashboard refused the router load of a metric point, sent without it: %s", exc)
            return _send(api, [{k: v for k, v in p.items() if k != ROUTER_LOAD} for p in points])
        log.warning("the dashboard refused %d metric points, dropped: %s", len(points), exc)
    except (ValueError, TypeError) as exc:  # not encodable as JSON: nothing a later round could change
        log.warning("%d metric points cannot be sent, dropped: %s", len(points), exc)
    return True
