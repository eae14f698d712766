import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_decimal, env_int, env_list, env_str

ROOT = Path(__file__).resolve().parent.parent


def test_it_reads_values_and_defaults(monkeypatch):
    monkeypatch.setenv("T_INT", " 42 ")
    monkeypatch.setenv("T_BOOL", "yes")
    monkeypatch.setenv("T_LIST", "a.example, b.example,,")
    monkeypatch.delenv("T_MISSING", raising=False)
    assert env_int("T_INT") == 42
    assert env_bool("T_BOOL") is True
    assert env_list("T_LIST") == ["a.example", "b.example"]
    assert env_str("T_MISSING", "fallback") == "fallback"


@pytest.mark.parametrize("reader, value, words", [
    (env_bool, "maybe", "T_BAD='maybe' is not a boolean"),
    (env_int, "12x", "T_BAD='12x' is not an integer"),
    (env_decimal, "1.2.3", "T_BAD='1.2.3' is not a decimal"),
    (env_decimal, "NaN", "is not a finite number"),
])
def test_it_fails_fast_naming_the_variable(monkeypatch, reader, value, words):
    monkeypatch.setenv("T_BAD", value)
    with pytest.raises(ImproperlyConfigured, match=words):
        reader("T_BAD")


def test_it_requires_a_variable_without_default(monkeypatch):
    monkeypatch.delenv("T_REQUIRED", raising=False)
    with pytest.raises(ImproperlyConfigured, match="T_REQUIRED is required"):
        env_str("T_REQUIRED")


def test_it_rejects_an_int_below_its_minimum(monkeypatch):
    monkeypatch.setenv("T_PORT", "0")
    with pytest.raises(ImproperlyConfigured, match="below the minimum 1"):
        env_int("T_PORT", minimum=1)


def _settings_in_fresh_process(tmp_path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    clean.update(DATA_DIR=str(tmp_path), **env)
    code = ("import json; from django.conf import settings as s; "
            "print(json.dumps([s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, s.VAST_API_URL]))")
    return subprocess.run([sys.executable, "-c", "import django, os; os.environ['DJANGO_SETTINGS_MODULE']="
                           "'config.settings'; django.setup(); " + code],
                          cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60)


def test_it_runs_embedded_without_database_url(tmp_path):
    result = _settings_in_fresh_process(tmp_path)
    assert result.returncode == 0, result.stderr
    engine, broker, vast_url = json.loads(result.stdout.strip().splitlines()[-1])
    assert engine == "django.db.backends.sqlite3"
    assert broker.startswith("filesystem://")
    assert vast_url.startswith("http://127.0.0.1:")  # the simulated marketplace


def test_it_switches_to_postgres_and_redis(tmp_path):
    result = _settings_in_fresh_process(tmp_path, DATABASE_URL="postgres://u@db.example:5432/fleet",
                                        REDIS_URL="redis://cache.example:6379/0", SECRET_KEY=secrets.token_urlsafe(50),
                                        SIMULATOR="0")
    assert result.returncode == 0, result.stderr
    engine, broker, vast_url = json.loads(result.stdout.strip().splitlines()[-1])
    assert engine == "django.db.backends.postgresql"
    assert broker == "redis://cache.example:6379/0"
    assert vast_url == "https://console.vast.ai/api/v0"


def test_it_refuses_production_without_a_secret_key(tmp_path):
    result = _settings_in_fresh_process(tmp_path, DATABASE_URL="postgres://u@db.example:5432/fleet")
    assert result.returncode != 0
    assert "SECRET_KEY is required" in result.stderr


def test_it_refuses_a_bad_value_at_start(tmp_path):
    result = _settings_in_fresh_process(tmp_path, OFFER_REFRESH_SECONDS="soon")
    assert result.returncode != 0
    assert "OFFER_REFRESH_SECONDS='soon' is not an integer" in result.stderr


def test_it_refuses_a_storage_grant_longer_than_its_bound_at_start(tmp_path):
    # A box's upload grant outlives its token by up to this long: an hour at most, whatever the environment says.
    result = _settings_in_fresh_process(tmp_path, STORAGE_UPLOAD_GRANT_S="86400")
    assert result.returncode != 0
    assert "STORAGE_UPLOAD_GRANT_S=86400 is above the maximum 3600" in result.stderr
    result = _settings_in_fresh_process(tmp_path, STORAGE_GRANT_S="999999")
    assert result.returncode != 0
    assert "STORAGE_GRANT_S=999999 is above the maximum 43200" in result.stderr


def test_it_refuses_a_stock_image_bootstrap_without_its_package(tmp_path):
    result = _settings_in_fresh_process(tmp_path, WORKER_BOOTSTRAP="onstart")
    assert result.returncode != 0
    assert "WORKER_BOOTSTRAP=onstart needs WORKER_STOCK_IMAGE and TRAINING_PACKAGE" in result.stderr


@pytest.mark.parametrize("key", ["k", "tests-only-secret-key", "s" * 60, "abcd" * 20,
                                 "django-insecure-" + "x1y2z3" * 10])
@pytest.mark.parametrize("https", ["0", "1"])
def test_it_refuses_a_weak_secret_key_whatever_https_says_without_printing_it(tmp_path, key, https):
    result = _settings_in_fresh_process(tmp_path, DATABASE_URL="postgres://u@db.example:5432/fleet", SECRET_KEY=key,
                                        HTTPS=https)
    assert result.returncode != 0
    assert "SECRET_KEY must be 50 or more random characters" in result.stderr
    assert repr(key) not in result.stderr and (len(key) == 1 or key not in result.stderr)


def test_the_embedded_default_generates_a_strong_key(tmp_path):
    result = _settings_in_fresh_process(tmp_path)
    assert result.returncode == 0, result.stderr
    key = (tmp_path / "secret_key").read_text().strip()
    assert len(key) >= 50 and len(set(key)) >= 5 and not key.startswith("django-insecure-")
