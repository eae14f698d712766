"""Waiting in tests for what a real worker, beat or box does in its own time."""

import time


def wait_until(check, what, timeout_s=30, every_s=0.2):
    """check()'s first truthy value, asked every `every_s` seconds; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
