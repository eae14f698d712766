"""Every page has an icon, and a missing page or a server error is the product's own page."""

import pytest
from django.contrib.staticfiles import finders
from django.template.loader import render_to_string


@pytest.mark.django_db
def test_it_answers_the_browsers_favicon_request_without_a_login(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("/favicon.svg")
    assert finders.find("favicon.svg")


@pytest.mark.django_db
def test_it_shows_a_missing_page_as_its_own_styled_page(client, member):
    client.force_login(member)
    response = client.get("/runs/999999/")
    body = response.content.decode()
    assert response.status_code == 404 and "<h1>Not found</h1>" in body
    assert "css/app.css" in body and 'href="/runs/"' in body


def test_it_renders_the_server_error_page_without_a_request_or_a_database():
    body = render_to_string("500.html")
    assert "Something went wrong on our side" in body and "css/app.css" in body and "favicon.svg" in body
