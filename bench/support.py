"""What the database benchmarks share: Django set up for a one-off process, and a throwaway PostgreSQL database
that never touches the test suite's or anyone's real one."""

import os
import secrets
import signal
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_django(name: str, **env: str) -> None:
    """Settings for a benchmark process: its own data folder, quiet logs, no Redis (hand-overs go to a broker kept
    in files, so no worker acts during a measurement), and PostgreSQL, which every figure is about."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 40)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["DATA_DIR"] = tempfile.mkdtemp(prefix=f"{name}-bench-")
    os.environ.pop("REDIS_URL", None)
    os.environ.update(env)
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to a PostgreSQL server (the bench makes its own database there).")
    import django

    django.setup()


@contextmanager
def throwaway_database(name: str):
    """A migrated database of this process's own for the length of the block: `name`, the process id and a random
    suffix, so that two runs at once (of one benchmark or two) never share or drop each other's. It is dropped when
    the block ends, however it ends: an exception, Ctrl-C, or a SIGTERM (turned into SystemExit, and held back while
    the database is being made, so that what gets dropped is always the new database). Yields its URL for child
    processes."""
    from django.db import connection
    from django.test.utils import setup_test_environment

    unique = database_name(name)
    setup_test_environment()
    connection.settings_dict["TEST"]["NAME"] = unique
    stop = _SigtermToExit()
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with stop.held():
            old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
        try:
            stop.raise_if_asked()
            yield os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/" + unique
        finally:
            connection.close()
            connection.creation.destroy_test_db(old_name, verbosity=0)
    finally:
        signal.signal(signal.SIGTERM, previous)


def database_name(name: str) -> str:
    """"bench_reaper" -> "bench_reaper_12345_3f9a1c": this process's own, within PostgreSQL's 63 characters."""
    return f"{name[:40]}_{os.getpid()}_{secrets.token_hex(3)}"


class _SigtermToExit:
    """A SIGTERM handler that raises SystemExit, or only notes the signal while `held`."""

    def __init__(self):
        self.holding = self.asked = False

    def __call__(self, signum, frame):
        self.asked = True
        if not self.holding:
            raise SystemExit(128 + signum)

    @contextmanager
    def held(self):
        self.holding = True
        try:
            yield
        finally:
            self.holding = False

    def raise_if_asked(self):
        if self.asked:
            raise SystemExit(128 + signal.SIGTERM)
