"""A serving box's dead-man switch, run beside vLLM: it checks in with the dashboard and stops its own machine when the
dashboard refuses it, or when no answer has renewed its token for the window (docs/agent.md, "The serving box's
watchdog"). Shipped to the box as text with `self_stop.py`, so it imports nothing else of the product."""

import logging
import os
import time

import httpx

from .self_stop import stop_machine

CHECKIN_S, DEAD_MAN_S = 15.0, 3 * 3600.0  # until the box's environment gives the dashboard's own
STOP_AGAIN_S = 60.0  # between stops asked for: the first may be refused or lost

log = logging.getLogger("serving-watchdog")


class Watchdog:
    """The check-ins of one box: each answer renews the token (kept for the next one); `reason` is set once the box
    must stop (refused, or the window passed unrenewed), and from then on each tick stops the machine."""

    def __init__(self, url: str, token: str, window_s: float, clock=time.monotonic):
        self.url, self.token, self.window_s, self.clock = url, token, window_s, clock
        self.renewed_at = clock()
        self.reason = ""

    def tick(self) -> None:
        """One round: a check-in while the box may go on; once it must stop, a stop of its machine, asked for again
        each round (a refused or lost stop call must not leave it billing)."""
        if not self.reason:
            try:
                self.check_in()
            except Exception:  # the dead-man switch lives in this loop: it must outlive any bug
                log.exception("check-in round failed")
        if not self.reason and self.clock() - self.renewed_at > self.window_s:
            self.reason = f"not renewed for {self.window_s:.0f} s (dead-man switch)"
        if self.reason:
            log.warning("stopping this machine: %s", self.reason)
            stop_machine()

    def check_in(self) -> None:
        """Renews the token from the dashboard's answer; a refusal sets `reason`; silence changes nothing."""
        try:
            response = httpx.post(self.url, json={}, headers={"Authorization": f"Bearer {self.token}"}, timeout=10)
        except httpx.HTTPError as exc:
            log.warning("check-in failed: %s", type(exc).__name__)
        else:
            if response.status_code in (401, 403):  # no longer wanted, or the token no longer opens anything
                self.reason = f"the dashboard no longer wants this box ({response.status_code}): {response.text[:200]}"
                return
            token = _renewed_token(response)
            if token:
                self.token, self.renewed_at = token, self.clock()
            else:
                log.warning("check-in answered %s without a renewed token", response.status_code)


def _renewed_token(response: httpx.Response) -> str:
    if response.status_code != 200:
        return ""
    try:
        answer = response.json()
    except ValueError:
        return ""
    token = answer.get("token") if isinstance(answer, dict) else None
    return token if isinstance(token, str) and token else ""


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s watchdog %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per check-in
    watchdog = Watchdog(os.environ["FLEET_CHECKIN_URL"], os.environ["FLEET_CHECKIN_TOKEN"],
                        float(os.environ.get("FLEET_DEAD_MAN_S", DEAD_MAN_S)))
    interval_s = float(os.environ.get("FLEET_CHECKIN_S", CHECKIN_S))
    while True:  # until the machine stops, and this process with it
        watchdog.tick()
        time.sleep(STOP_AGAIN_S if watchdog.reason else interval_s)


if __name__ == "__main__":
    main()
