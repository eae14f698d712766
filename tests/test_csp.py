"""Every response carries a strict Content-Security-Policy: every page the URLs name (the admin's included), static
files, redirects, errors and the API. tests/browser/test_csp_browser.py shows the pages work under it."""

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.runs.seeding import seed_run

pytestmark = pytest.mark.django_db


def policy(response) -> dict[str, set[str]]:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"{response.status_code} without a Content-Security-Policy"
    directives = [part.split() for part in header.split(";") if part.strip()]
    return {name: set(sources) for name, *sources in directives}


def assert_strict(response, where: str) -> None:
    directives = policy(response)
    assert directives["default-src"] == {"'self'"}, where
    assert directives["script-src"] == {"'self'"}, where  # no 'unsafe-inline', no 'unsafe-eval'
    assert directives["object-src"] == {"'none'"}, where
    assert directives["base-uri"] == {"'self'"}, where
    assert directives["frame-ancestors"] == {"'none'"}, where
    assert directives["form-action"] == {"'self'"}, where


def _paths(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _paths(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern)


def every_page(pk: int) -> list[str]:
    """Every URL pattern as a path, its arguments filled with `pk` (an object that may not exist: a 404 counts too)."""
    pages = []
    for route in _paths(get_resolver().url_patterns):
        if "(?P<url>" in route:  # the admin's catch-all
            continue
        route = route.replace("^(?P<app_label>auth|axes|fleet|django_celery_beat|runs)/$", "fleet/")
        pages.append("/" + re.sub(r"<(?:\w+:)?\w+>", str(pk), route))
    return pages


def test_it_walks_the_admin_and_the_dashboard():
    pages = every_page(1)
    assert {"/", "/offers/", "/runs/1/", "/runs/launch/", "/admin/", "/admin/fleet/", "/admin/runs/run/1/change/",
            "/login/", "/api/agent/v1/heartbeat"} <= set(pages)
    assert not [page for page in pages if "<" in page or "(" in page]


def test_it_sets_the_policy_on_every_page_for_a_logged_in_operator(client, operator):
    run = seed_run("healthy")
    client.force_login(operator)
    for page in every_page(run.pk):
        response = client.get(page)
        assert response.status_code < 500, page
        assert_strict(response, page)


def test_it_sets_the_policy_before_a_login_and_on_static_files(client, settings):
    settings.WHITENOISE_USE_FINDERS = True  # WhiteNoise serves from the source folders, as after collectstatic
    for asset in ("/static/js/offers.js", "/static/favicon.svg", "/static/vendor/plotly.min.js"):
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert_strict(response, asset)
    for page in every_page(1) + ["/no-such-page/"]:
        assert_strict(client.get(page), page)
    failed = client.post("/login/", {"username": "nobody", "password": "wrong"}, REMOTE_ADDR="203.0.113.9")
    assert failed.status_code == 200
    assert_strict(failed, "a failed login")
