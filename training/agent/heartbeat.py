"""The box's heartbeat, and with it the dead-man switch: a box whose credentials are not renewed stops itself."""

import logging
import threading
import time

from .dashboard import Api, Refused
from .gpu import gpu_status

log = logging.getLogger(__name__)
# A state a dashboard from before the eval phase refuses (422), and the one it is sent as there instead.
KNOWN_BEFORE = {"evaluating": "training"}


class Heartbeat(threading.Thread):
    """Heartbeats from start to end, the install included. Each answer renews the credentials; `stop` is set when the
    dashboard says stop, and `self_stop` too when it says stop_machine, refuses this box's token, or the dead-man
    window passes unrenewed. Nothing an answer holds can end the thread."""

    def __init__(self, api: Api, interval_s: float, window_s: float):
        super().__init__(name="heartbeat", daemon=True)
        self.api, self.interval_s, self.window_s = api, interval_s, window_s
        self.status: dict = {"state": "installing"}
        # Storage grants expire (presigned URLs): each answer brings a fresh one, handed to whoever uploads.
        self.on_upload_grant = lambda grant: None
        self.stop = threading.Event()
        self.stop_reason = ""
        self.self_stop = False
        self._done = threading.Event()
        self._renewed_at = time.monotonic()
        self._older_dashboard = False

    def run(self):
        while not self._done.is_set():
            try:
                self.beat()
            except Exception:  # the dead-man switch lives in this thread: it must outlive any bug
                log.exception("heartbeat round failed")
                self._check_window()
            self._done.wait(self.interval_s)

    def beat(self):
        status = dict(self.status)
        if self._older_dashboard and status.get("state") in KNOWN_BEFORE:
            status["state"] = KNOWN_BEFORE[status["state"]]
        try:
            answer = self.api.call("POST", "heartbeat", {**status, **gpu_status()})
        except Refused as exc:
            if exc.status == 422 and status.get("state") in KNOWN_BEFORE and not self._older_dashboard:
                log.warning("the dashboard does not know the state %s: sent as %s", status["state"],
                            KNOWN_BEFORE[status["state"]])
                self._older_dashboard = True
                return self.beat()
            if exc.status in (401, 403):  # revoked: the run ended, or another box replaced this one
                self._halt(f"the dashboard no longer accepts this box ({exc.status})", self_stop=True)
            log.warning("heartbeat refused: %s", exc)
            self._check_window()
            return
        except ConnectionError as exc:
            log.warning("heartbeat failed: %s", exc)
            self._check_window()
            return
        if not isinstance(answer, dict):
            log.warning("heartbeat answer is not an object: %r", str(answer)[:200])
            self._check_window()
            return
        self._renewed_at = time.monotonic()
        if isinstance(answer.get("upload"), dict):
            self.on_upload_grant(answer["upload"])
        command, reason = answer.get("command"), str(answer.get("reason") or "")[:300]
        if command == "stop":
            self._halt(f"the dashboard said stop{': ' + reason if reason else ''}", self_stop=False)
        elif command == "stop_machine":
            self._halt(f"the dashboard said stop this machine{': ' + reason if reason else ''}", self_stop=True)
        elif command != "continue":
            log.warning("heartbeat answer without a known command: %r", str(command)[:100])

    def _check_window(self):
        if time.monotonic() - self._renewed_at > self.window_s:
            self._halt(f"credentials not renewed for {self.window_s:.0f} s (dead-man switch)", self_stop=True)

    def _halt(self, reason: str, *, self_stop: bool):
        if self_stop:
            self.self_stop = True
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def finish(self):
        self._done.set()
