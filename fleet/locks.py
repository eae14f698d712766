"""A claim on a named piece of work that two workers never hold at once, taken without waiting: a PostgreSQL advisory
lock, or a file lock under DATA_DIR on SQLite (docs/fleet.md, "fleet/locks.py")."""

import fcntl
import re
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connection


@contextmanager
def claim(name: str) -> Iterator[bool]:
    """Yields whether this process holds `name` now; if it does, it lets go on leaving the block."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [name])
            held = cursor.fetchone()[0]
        try:
            yield held
        finally:
            if held:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [name])
        return
    folder = settings.DATA_DIR / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".lock"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
