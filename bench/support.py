"""What the database benchmarks share: Django set up for a one-off process, and a throwaway PostgreSQL database
that never touches the test suite's or anyone's real one, copied from a template migrated once per set of
migrations."""

import hashlib
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
    """A migrated database of this process's own (`name`, the process id, a random suffix: two runs at once never
    share one) for the length of the block, copied from the migrated template. Dropped however the block ends: an
    exception, Ctrl-C, a SIGTERM (held back while it is being made). Yields its URL for child processes."""
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    unique = database_name(name)
    setup_test_environment()
    stop = _SigtermToExit()
    previous = signal.signal(signal.SIGTERM, stop)
    old_name = connection.settings_dict["NAME"]
    try:
        with stop.held():
            template = _migrated_template()
            with connection._nodb_cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{unique}" TEMPLATE "{template}"')
            connection.close()
            settings.DATABASES[connection.alias]["NAME"] = connection.settings_dict["NAME"] = unique
        try:
            stop.raise_if_asked()
            yield os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/" + unique
        finally:
            connection.close()
            settings.DATABASES[connection.alias]["NAME"] = connection.settings_dict["NAME"] = old_name
            with connection._nodb_cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{unique}" WITH (FORCE)')
    finally:
        signal.signal(signal.SIGTERM, previous)


def _migrated_template() -> str:
    """The name of a database migrated as this code's migrations say, made once (about 20 s on the 2-core machine)
    and then copied by every benchmark in well under a second. Its name holds a digest of the migrations, so a new
    migration makes a new one; the older ones are dropped then."""
    from django.db import DatabaseError, connection

    template = "bench_template_" + _migrations_digest()
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(hashtext('bench_template'))")  # one maker at a time
        try:
            cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [r"bench\_template\_%"])
            existing = [row[0] for row in cursor.fetchall()]
            if template not in existing:
                cursor.execute(f'ALTER DATABASE "{_migrated_database()}" RENAME TO "{template}"')
                for stale in existing:
                    try:
                        cursor.execute(f'DROP DATABASE IF EXISTS "{stale}"')
                    except DatabaseError:  # an older checkout copying it now: a later maker drops it
                        pass
        finally:
            cursor.execute("SELECT pg_advisory_unlock(hashtext('bench_template'))")
    return template


def _migrated_database() -> str:
    """A new database with every migration applied, by Django's test set-up; dropped again if that fails."""
    from django.conf import settings
    from django.db import connection

    building = connection.settings_dict["TEST"]["NAME"] = database_name("bench_building")
    old_name = connection.settings_dict["NAME"]
    try:
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    except BaseException:
        connection.close()
        settings.DATABASES[connection.alias]["NAME"] = connection.settings_dict["NAME"] = old_name
        with connection._nodb_cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
        raise
    connection.close()
    settings.DATABASES[connection.alias]["NAME"] = connection.settings_dict["NAME"] = old_name
    return building


def _migrations_digest() -> str:
    """A digest of Django's version and every installed app's migration files."""
    import django
    from django.apps import apps

    digest = hashlib.sha256(django.get_version().encode())
    for app in sorted(apps.get_app_configs(), key=lambda a: a.label):
        folder = Path(app.path) / "migrations"
        for path in sorted(folder.glob("*.py")) if folder.is_dir() else ():
            digest.update(f"{app.label}/{path.name}".encode() + path.read_bytes())
    return digest.hexdigest()[:16]


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
