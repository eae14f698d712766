"""Failed logins lock one username from one address out for a while, on the login page and on the admin's."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

ROOT = Path(__file__).resolve().parent.parent
LOGIN = "/login/"
ADMIN_LOGIN = "/admin/login/"


def _post(client, url, username, password, address="203.0.113.5", **headers):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address, **headers)


def _fail(client, url, username, times=None, **kwargs):
    for _ in range(settings.AXES_FAILURE_LIMIT if times is None else times):
        response = _post(client, url, username, "wrong-password", **kwargs)
        assert response.status_code in (200, 429)


def _logged_in(client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.django_db
def test_it_refuses_the_right_password_after_the_failure_limit(client, operator):
    _fail(client, LOGIN, "operator", times=200)
    response = _post(client, LOGIN, "operator", "operator-pass-123")
    assert response.status_code == 429
    assert not _logged_in(client)
    text = response.content.decode()
    assert "Too many failed logins" in text and "operator" in text
    assert f"refused for {settings.AXES_COOLOFF_TIME.total_seconds() / 60:.0f} minutes" in text


@pytest.mark.django_db
def test_it_locks_out_after_exactly_the_limit(client, operator):
    _fail(client, LOGIN, "operator", times=settings.AXES_FAILURE_LIMIT - 1)
    assert _post(client, LOGIN, "operator", "operator-pass-123").status_code == 302
    assert _logged_in(client)
    client.logout()
    _fail(client, LOGIN, "operator")  # a success starts the count again
    assert _post(client, LOGIN, "operator", "operator-pass-123").status_code == 429


@pytest.mark.django_db
def test_it_locks_the_admin_login_too(client, operator):
    _fail(client, ADMIN_LOGIN, "operator")
    response = _post(client, ADMIN_LOGIN, "operator", "operator-pass-123")
    assert response.status_code == 429 and "Too many failed logins" in response.content.decode()
    assert not _logged_in(client)
    # one count for both doors
    assert _post(client, LOGIN, "operator", "operator-pass-123").status_code == 429


@pytest.mark.django_db
def test_it_locks_only_that_username_from_that_address(client, operator, member):
    _fail(client, LOGIN, "operator")
    assert _post(client, LOGIN, "member", "member-pass-123").status_code == 302
    client.logout()
    assert _post(client, LOGIN, "operator", "operator-pass-123", address="198.51.100.7").status_code == 302


@pytest.mark.django_db
def test_it_bounds_guesses_at_one_account_spread_over_many_addresses(client, operator, member, settings):
    settings.LOGIN_ACCOUNT_FAILURE_LIMIT = 12
    for n in range(3):  # four guesses from each address stay under the per-address limit of five
        _fail(client, LOGIN, "operator", times=4, address=f"198.51.100.{n + 10}")
    fresh = _post(client, LOGIN, "operator", "operator-pass-123", address="192.0.2.200")
    assert fresh.status_code == 429 and not _logged_in(client)
    assert "from many addresses" in fresh.content.decode()
    # Another account is not touched, and the failures age out like the per-address ones.
    assert _post(client, LOGIN, "member", "member-pass-123", address="192.0.2.200").status_code == 302
    client.logout()
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert _post(client, LOGIN, "operator", "operator-pass-123", address="192.0.2.200").status_code == 302


def _age_attempts(by: timedelta) -> None:
    """Moves every recorded failure `by` into the past, as if that much time had gone by."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - by)


@pytest.mark.django_db
@pytest.mark.parametrize("door", [LOGIN, ADMIN_LOGIN])
def test_it_lets_the_right_password_in_from_another_address_after_sixty_failures_from_one(client, operator, door):
    attacker, owner = "203.0.113.5", "198.51.100.7"
    _fail(client, door, "operator", times=60, address=attacker)
    for url, home in ((LOGIN, "/"), (f"{ADMIN_LOGIN}?next=/admin/", "/admin/")):
        response = _post(client, url, "operator", "operator-pass-123", address=owner)
        assert response.status_code == 302 and response["Location"] == home, url
        assert _logged_in(client) and client.get(home).status_code == 200
        client.logout()
    # The address that guessed is still locked out, on both doors.
    for url in (LOGIN, ADMIN_LOGIN):
        locked = _post(client, url, "operator", "operator-pass-123", address=attacker)
        assert locked.status_code == 429 and "from your address" in locked.content.decode()
        assert not _logged_in(client)


def _login_over_http(base_url: str, client_address: str, password: str) -> int:
    """One login through the running server as a browser behind the proxy makes it: the login page, then the post."""
    with requests.Session() as browser:
        headers = {"X-Forwarded-For": client_address}
        browser.get(base_url + LOGIN, headers=headers, timeout=30)
        response = browser.post(base_url + LOGIN, headers={**headers, "Referer": base_url + LOGIN}, timeout=30,
                                allow_redirects=False, data={"username": "operator", "password": password,
                                                             "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
        return response.status_code


@pytest.mark.django_db(transaction=True)
def test_it_keeps_a_burst_of_guesses_from_one_address_to_that_address(live_server, operator, settings):
    # Sixty guesses at once all pass the lock check before any is recorded: however many get counted for the
    # address, it counts toward the account's limit no more than its own.
    settings.LOGIN_CLIENT_IP_META_KEY = "HTTP_X_FORWARDED_FOR"
    with ThreadPoolExecutor(max_workers=20) as pool:
        statuses = list(pool.map(lambda _: _login_over_http(live_server.url, "203.0.113.5", "wrong-password"),
                                 range(60)))
    assert set(statuses) <= {200, 429} and 429 in statuses
    assert _login_over_http(live_server.url, "198.51.100.7", "operator-pass-123") == 302
    assert _login_over_http(live_server.url, "203.0.113.5", "operator-pass-123") == 429


@pytest.mark.django_db
def test_it_does_not_extend_a_lock_with_the_attempts_made_during_it(client, operator):
    _fail(client, LOGIN, "operator")
    _age_attempts(settings.AXES_COOLOFF_TIME - timedelta(minutes=1))
    _fail(client, LOGIN, "operator", times=20)  # a minute before the lock ends, refused, every one
    _fail(client, ADMIN_LOGIN, "operator", times=20)
    assert _post(client, LOGIN, "operator", "operator-pass-123").status_code == 429
    _age_attempts(timedelta(minutes=1, seconds=1))  # the cool-off since the failure that locked it is over
    assert _post(client, LOGIN, "operator", "operator-pass-123").status_code == 302
    assert _logged_in(client)


@pytest.mark.django_db
def test_it_does_not_extend_the_account_lock_with_the_attempts_made_during_it(client, operator, settings):
    settings.LOGIN_ACCOUNT_FAILURE_LIMIT = 12
    for n in range(3):
        _fail(client, LOGIN, "operator", times=4, address=f"198.51.100.{n + 10}")
    _age_attempts(settings.AXES_COOLOFF_TIME - timedelta(minutes=1))
    latecomer = "192.0.2.200"  # refused by the account's lock; its guesses count for neither lock
    _fail(client, LOGIN, "operator", times=10, address=latecomer)
    assert _post(client, LOGIN, "operator", "operator-pass-123", address=latecomer).status_code == 429
    _age_attempts(timedelta(minutes=1, seconds=1))
    assert _post(client, LOGIN, "operator", "operator-pass-123", address=latecomer).status_code == 302


@pytest.mark.django_db
def test_it_counts_an_ipv6_client_by_its_64_bit_network(client, operator):
    # One IPv6 machine is given a whole /64: counted address by address, it could guess without end.
    _fail(client, LOGIN, "operator", times=1, address="2001:db8:1:2::1")
    _fail(client, LOGIN, "operator", times=settings.AXES_FAILURE_LIMIT - 1, address="2001:db8:1:2:aa::7")
    assert _post(client, LOGIN, "operator", "operator-pass-123", address="2001:db8:1:2:ffff::9").status_code == 429
    assert _post(client, LOGIN, "operator", "operator-pass-123", address="2001:db8:1:3::1").status_code == 302


@pytest.mark.django_db
def test_it_lets_the_pair_in_again_after_the_cool_off(client, operator):
    _fail(client, LOGIN, "operator")
    assert _post(client, LOGIN, "operator", "operator-pass-123").status_code == 429
    for attempt in AccessAttempt.objects.all():
        attempt.attempt_time -= settings.AXES_COOLOFF_TIME + timedelta(seconds=1)
        attempt.save()
    assert _post(client, LOGIN, "operator", "operator-pass-123").status_code == 302
    assert _logged_in(client)


@pytest.mark.django_db
def test_it_ignores_a_forwarded_address_unless_configured(client, operator):
    _fail(client, LOGIN, "operator")
    response = _post(client, LOGIN, "operator", "operator-pass-123", HTTP_X_FORWARDED_FOR="192.0.2.99")
    assert response.status_code == 429


@pytest.mark.django_db
def test_it_counts_by_the_configured_proxy_header(client, operator, settings):
    settings.LOGIN_CLIENT_IP_META_KEY = "HTTP_X_FORWARDED_FOR"
    proxy = "10.0.0.2"  # every request comes through the proxy
    _fail(client, LOGIN, "operator", address=proxy, HTTP_X_FORWARDED_FOR="192.0.2.10")
    # A client who prepends an address of its own is still counted by the one the proxy appended.
    spoofed = _post(client, LOGIN, "operator", "operator-pass-123", address=proxy,
                    HTTP_X_FORWARDED_FOR="198.51.100.1, 192.0.2.10")
    assert spoofed.status_code == 429
    # Another client behind the same proxy is not locked out by the first one's failures.
    other = _post(client, LOGIN, "operator", "operator-pass-123", address=proxy, HTTP_X_FORWARDED_FOR="192.0.2.20")
    assert other.status_code == 302 and _logged_in(client)


@pytest.mark.django_db
def test_the_tests_own_logins_keep_working(client, operator):
    assert client.login(username="operator", password="operator-pass-123")
    client.logout()
    client.force_login(operator)
    assert client.get(reverse("dashboard")).status_code == 200


def _settings_in_fresh_process(tmp_path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    clean.update(DATA_DIR=str(tmp_path), **env)
    code = ("import json; from django.conf import settings as s; print(json.dumps([s.AXES_FAILURE_LIMIT, "
            "s.AXES_COOLOFF_TIME.total_seconds(), s.LOGIN_CLIENT_IP_META_KEY]))")
    return subprocess.run([sys.executable, "-c", "import django, os; os.environ['DJANGO_SETTINGS_MODULE']="
                           "'config.settings'; django.setup(); " + code],
                          cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60)


def test_its_settings_come_from_the_environment(tmp_path):
    defaults = _settings_in_fresh_process(tmp_path)
    assert defaults.returncode == 0, defaults.stderr
    assert json.loads(defaults.stdout.strip().splitlines()[-1]) == [5, 900.0, ""]
    chosen = _settings_in_fresh_process(tmp_path, LOGIN_FAILURE_LIMIT="3", LOGIN_COOLOFF_MIN="60",
                                        LOGIN_CLIENT_IP_HEADER="X-Forwarded-For")
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout.strip().splitlines()[-1]) == [3, 3600.0, "HTTP_X_FORWARDED_FOR"]
    bad = _settings_in_fresh_process(tmp_path, LOGIN_CLIENT_IP_HEADER="X-Forwarded-For: 1.2.3.4")
    assert bad.returncode != 0 and "LOGIN_CLIENT_IP_HEADER" in bad.stderr


def test_it_refuses_an_account_limit_that_one_address_could_reach(tmp_path):
    # Each address counts toward the account's limit only up to its own: an account limit at or below it would let
    # one address lock the username out for everyone.
    refused = _settings_in_fresh_process(tmp_path, LOGIN_FAILURE_LIMIT="10", LOGIN_ACCOUNT_FAILURE_LIMIT="10")
    assert refused.returncode != 0
    assert "LOGIN_ACCOUNT_FAILURE_LIMIT" in refused.stderr and "LOGIN_FAILURE_LIMIT" in refused.stderr
    allowed = _settings_in_fresh_process(tmp_path, LOGIN_FAILURE_LIMIT="10", LOGIN_ACCOUNT_FAILURE_LIMIT="11")
    assert allowed.returncode == 0, allowed.stderr
