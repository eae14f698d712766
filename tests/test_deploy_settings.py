"""Production settings pass `manage.py check --deploy`; the embedded default stays plain HTTP on loopback; every
Celery task has a queue."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from config.celery import app

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = {
    "DATABASE_URL": "postgres://fleet:pw@db.example:5432/fleet",
    "REDIS_URL": "redis://cache.example:6379/0",
    "ALLOWED_HOSTS": "fleet.example.com",
}


def _manage(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS", "HTTPS", "DEBUG")}
    clean.update(DATA_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=clean, capture_output=True, text=True,
                          timeout=120)


def _shell(tmp_path, code: str, **env) -> subprocess.CompletedProcess:
    return _manage(tmp_path, "shell", "--no-imports", "-c", code, **env)


def test_production_passes_check_deploy(tmp_path):
    result = _manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING",
                     SECRET_KEY=secrets.token_urlsafe(48), **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_behind_a_tls_proxy_trusts_its_header(tmp_path):
    result = _shell(tmp_path, "from django.conf import settings as s; "
                              "print(s.SECURE_PROXY_SSL_HEADER, s.SECURE_SSL_REDIRECT, s.SECURE_REDIRECT_EXEMPT)",
                    SECRET_KEY=secrets.token_urlsafe(48), SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto", **PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "('HTTP_X_FORWARDED_PROTO', 'https') True ['^healthz$']"


def test_production_refuses_a_short_secret_key(tmp_path):
    result = _manage(tmp_path, "check", SECRET_KEY="too-short", **PRODUCTION)
    assert result.returncode != 0
    assert "SECRET_KEY must be 50 or more random characters" in result.stderr


def test_check_deploy_fails_without_production_settings(tmp_path):
    # The check is not vacuous: the same stack with HTTPS switched off is reported.
    result = _manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING",
                     SECRET_KEY=secrets.token_urlsafe(48), HTTPS="0", **PRODUCTION)
    assert result.returncode != 0
    assert "security.W008" in result.stderr + result.stdout


def test_the_embedded_default_stays_plain_http_on_loopback(tmp_path):
    result = _shell(tmp_path, "from django.conf import settings as s; "
                              "print(s.HTTPS, s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.ALLOWED_HOSTS)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "False False False ['127.0.0.1', 'localhost', '[::1]']"


def test_healthz_answers_without_login_and_checks_the_database(client, db):
    response = client.get("/healthz")
    assert (response.status_code, response.content) == (200, b"ok\n")
    assert "no-cache" in response["Cache-Control"]


def test_healthz_says_so_when_the_database_is_down(client, db, monkeypatch):
    from django.db import OperationalError

    class Down:
        def cursor(self):
            raise OperationalError("connection refused")

    monkeypatch.setattr("config.health.connection", Down())
    response = client.get("/healthz")
    assert response.status_code == 503
    assert b"database unavailable" in response.content


def test_healthz_is_exempt_from_the_https_redirect(client, db, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    assert client.get("/healthz").status_code == 200
    assert client.get("/login/").status_code == 301


def test_the_beat_check_reads_beat_s_last_write(db):
    from datetime import timedelta

    from django.utils import timezone
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from config.health import beat_last_sent

    assert beat_last_sent(timedelta(minutes=10))[0] is False
    every = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    task = PeriodicTask.objects.create(name="supervise-runs", task="runs.tasks.supervise_runs", interval=every,
                                       last_run_at=timezone.now() - timedelta(minutes=20))
    assert beat_last_sent(timedelta(minutes=10))[0] is False
    PeriodicTask.objects.filter(pk=task.pk).update(last_run_at=timezone.now() - timedelta(minutes=2))
    healthy, line = beat_last_sent(timedelta(minutes=10))
    assert healthy and "ago" in line


def _our_tasks() -> list[str]:
    app.loader.import_default_modules()  # autodiscovery, as a worker does at start
    return sorted(name for name in app.tasks if name.startswith(("fleet.", "runs.")))


OUR_TASKS = _our_tasks()


def test_it_found_the_tasks():
    assert "fleet.tasks.rent_instance" in OUR_TASKS and "runs.tasks.supervise_runs" in OUR_TASKS


@pytest.mark.parametrize("name", OUR_TASKS)
def test_every_task_is_routed_to_a_queue(name):
    queue = settings.CELERY_TASK_ROUTES[name]["queue"]
    assert queue in settings.CELERY_TASK_QUEUES
    assert app.amqp.router.route({}, name)["queue"].name == queue


@pytest.mark.parametrize("name", ["fleet.tasks.rent_instance", "fleet.tasks.destroy_instance",
                                  "fleet.tasks.move_instance", "runs.tasks.supervise_runs",
                                  "fleet.tasks.reap_instances"])
def test_renting_destroying_and_recovery_run_on_the_slow_queue(name):
    assert settings.CELERY_TASK_ROUTES[name]["queue"] == "slow"


@pytest.mark.parametrize("name", ["fleet.tasks.probe_serving_instances", "fleet.tasks.sync_instances",
                                  "fleet.tasks.refresh_offers", "fleet.tasks.deliver_webhook"])
def test_probes_syncs_and_webhooks_run_on_the_fast_queue(name):
    assert settings.CELERY_TASK_ROUTES[name]["queue"] == "fast"


@pytest.mark.django_db
def test_a_vanished_workers_postgresql_session_is_probed_within_minutes():
    # Its claims are advisory locks of its session: the server must find a dead peer long before TCP's two hours.
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the embedded default's SQLite has no sessions to outlive a worker")
    with connection.cursor() as cursor:
        shown = {}
        for name in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"):
            cursor.execute(f"SHOW {name}")
            shown[name] = int(cursor.fetchone()[0])
    assert shown == {"tcp_keepalives_idle": 60, "tcp_keepalives_interval": 10, "tcp_keepalives_count": 6}
    assert shown["tcp_keepalives_idle"] + shown["tcp_keepalives_interval"] * shown["tcp_keepalives_count"] <= 300
