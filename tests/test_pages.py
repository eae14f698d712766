import pytest
from django.urls import reverse


PAGES = ["dashboard", "offers", "instances", "runs", "inference", "alerts"]


@pytest.mark.django_db
@pytest.mark.parametrize("page", PAGES)
def test_it_sends_anonymous_visitors_to_the_login_page(client, page):
    response = client.get(reverse(page))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_it_shows_the_navigation_after_login(client, operator):
    response = client.post(reverse("login"), {"username": "operator", "password": "operator-pass-123"}, follow=True)
    body = response.content.decode()
    for label in ["Offers", "Instances", "Runs", "Inference fleet", "Alerts", "Admin"]:
        assert f">{label}</a>" in body


@pytest.mark.django_db
def test_it_hides_the_admin_link_from_a_member(client, member):
    client.force_login(member)
    body = client.get(reverse("dashboard")).content.decode()
    assert ">Offers</a>" in body
    assert ">Admin</a>" not in body


@pytest.mark.django_db
def test_it_rejects_a_wrong_password(client, operator):
    response = client.post(reverse("login"), {"username": "operator", "password": "nope"})
    assert response.status_code == 200
    assert "didn't match" in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_it_serves_the_admin_to_the_operator(client, operator):
    client.force_login(operator)
    assert client.get(reverse("admin:index")).status_code == 200
    assert client.get(reverse("admin:fleet_offer_changelist")).status_code == 200


@pytest.mark.django_db
def test_it_requires_csrf_on_login():
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    response = strict.post(reverse("login"), {"username": "x", "password": "y"})
    assert response.status_code == 403
