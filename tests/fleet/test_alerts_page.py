"""The Alerts page: alerts, endpoints with their deliveries, and what only permitted staff may do."""

import re

import pytest
from django.test import Client
from django.urls import reverse

from fleet.alerts import notify
from fleet.models import Alert, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db
State = WebhookDelivery.State
NEW = {"name": "ops", "url": "https://hooks.example.com/T000/B000/abcdef", "events": ["instance.reaped", "run.failed"]}


def _endpoint(name="ops", **fields):
    return notify.create_endpoint(name=name, url=fields.pop("url", "https://hooks.example.com/x"),
                                  events=fields.pop("events", []), slack=fields.pop("slack", False))


def _buttons(page: str) -> list[str]:
    return re.findall(r"<button[^>]*>([^<]+)</button>", page)


def test_it_lists_alerts_and_endpoints_with_their_deliveries(client, staff):
    ops = _endpoint("ops", url="https://hooks.example.com/services/SECRET-PATH")
    notify.raise_alert(Alert.Kind.INSTANCE_REAPED, "vast-3: age 12h03m > max 12h")
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(state=State.RETRYING, attempts=2, last_status_code=503,
                                                          last_error="HTTP 503")
    client.force_login(staff)  # staff see every alert
    page = client.get(reverse("alerts")).content.decode()
    assert "vast-3: age 12h03m &gt; max 12h" in page
    assert f'data-endpoint="{ops.pk}"' in page and "hooks.example.com" in page
    assert "SECRET-PATH" not in page and ops.secret not in page
    assert delivery.message_id in page and "HTTP 503" in page and "retrying" in page


def test_it_shows_a_member_no_buttons_and_refuses_its_posts(client, member):
    ops = _endpoint()
    client.force_login(member)
    page = client.get(reverse("alerts")).content.decode()
    assert _buttons(page) == ["Log out"]
    assert client.post(reverse("add_webhook_endpoint"), NEW).status_code == 403
    assert client.post(reverse("test_webhook_endpoint", args=[ops.pk])).status_code == 403
    assert client.post(reverse("enable_webhook_endpoint", args=[ops.pk]), {"enabled": "0"}).status_code == 403
    assert WebhookEndpoint.objects.count() == 1 and WebhookEndpoint.objects.get().enabled
    assert Alert.objects.count() == 0


def test_it_refuses_staff_without_the_permission(client, django_user_model):
    ops = _endpoint()
    client.force_login(django_user_model.objects.create_user("viewer", password="viewer-pass-123", is_staff=True))
    assert "Send test" not in client.get(reverse("alerts")).content.decode()
    assert client.post(reverse("add_webhook_endpoint"), NEW).status_code == 403
    assert client.post(reverse("test_webhook_endpoint", args=[ops.pk])).status_code == 403


def test_it_needs_a_login(client):
    response = client.get(reverse("alerts"))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_it_adds_an_endpoint_and_shows_its_secret_once(client, staff):
    client.force_login(staff)
    response = client.post(reverse("add_webhook_endpoint"), NEW)
    assert response.status_code == 201 and "no-store" in response["Cache-Control"]  # no cache keeps the secret
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.name, endpoint.url, endpoint.events, endpoint.slack, endpoint.created_by) == \
        ("ops", NEW["url"], ["instance.reaped", "run.failed"], False, staff)
    assert endpoint.secret.startswith("whsec_") and endpoint.secret in response.content.decode()
    assert endpoint.secret not in client.get(reverse("alerts")).content.decode()


def test_it_refuses_a_bad_endpoint(client, staff):
    client.force_login(staff)
    for bad in ({**NEW, "url": "ftp://example.com/x"}, {**NEW, "url": "not a url"}, {**NEW, "events": ["nope"]},
                {**NEW, "name": ""}):
        assert client.post(reverse("add_webhook_endpoint"), bad).status_code == 400
    assert WebhookEndpoint.objects.count() == 0


def test_it_refuses_an_endpoint_on_an_internal_address_with_the_reason_by_the_field(client, staff):
    client.force_login(staff)
    response = client.post(reverse("add_webhook_endpoint"), {**NEW, "url": "http://169.254.169.254/latest/meta-data"})
    assert response.status_code == 400
    assert "169.254.169.254 is a cloud metadata address" in response.content.decode()
    assert WebhookEndpoint.objects.count() == 0


def test_it_shows_no_credentials_of_an_endpoint_url(client, member):
    _endpoint("ops", url="https://bot:hunter2@hooks.example.com/services/SECRET-PATH")
    client.force_login(member)
    page = client.get(reverse("alerts")).content.decode()
    assert "hooks.example.com" in page and "hunter2" not in page and "SECRET-PATH" not in page


def test_it_checks_csrf_on_every_form(staff):
    ops = _endpoint()
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.post(reverse("add_webhook_endpoint"), NEW).status_code == 403
    assert client.post(reverse("test_webhook_endpoint", args=[ops.pk])).status_code == 403
    assert client.post(reverse("enable_webhook_endpoint", args=[ops.pk]), {"enabled": "0"}).status_code == 403
    assert WebhookEndpoint.objects.count() == 1 and Alert.objects.count() == 0

    page = client.get(reverse("alerts")).content.decode()
    assert page.count('name="csrfmiddlewaretoken"') == 4  # log out, add, test, disable
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert client.post(reverse("add_webhook_endpoint"), {**NEW, "csrfmiddlewaretoken": token}).status_code == 201


def test_it_sends_a_test_to_one_endpoint(client, staff, django_capture_on_commit_callbacks):
    ops = _endpoint("ops", events=["run.failed"])
    other = _endpoint("other")
    client.force_login(staff)
    with django_capture_on_commit_callbacks() as queued:
        response = client.post(reverse("test_webhook_endpoint", args=[ops.pk]))
    assert response.status_code == 302
    assert len(queued) == 1
    delivery = WebhookDelivery.objects.select_related("alert").get()
    assert delivery.endpoint == ops and delivery.state == State.PENDING
    assert delivery.alert.kind == "test" and "Test alert" in delivery.alert.message
    assert not other.deliveries.exists()
    page = client.get(response["Location"]).content.decode()
    assert delivery.message_id in page


def test_it_disables_and_enables_an_endpoint(client, staff):
    ops = _endpoint()
    client.force_login(staff)
    assert client.post(reverse("enable_webhook_endpoint", args=[ops.pk]), {"enabled": "0"}).status_code == 302
    ops.refresh_from_db()
    assert not ops.enabled and ops.disabled_reason == "disabled by staff"
    page = client.get(reverse("alerts")).content.decode()
    assert "Enable" in _buttons(page) and "Send test" not in _buttons(page)
    notify.raise_alert(Alert.Kind.RUN_FAILED, "not sent: disabled")
    assert not WebhookDelivery.objects.exists()

    client.post(reverse("enable_webhook_endpoint", args=[ops.pk]), {"enabled": "1"})
    ops.refresh_from_db()
    assert ops.enabled and ops.disabled_reason == ""
    assert "Disable" in _buttons(client.get(reverse("alerts")).content.decode())


def test_leave_to_add_endpoints_is_not_leave_to_silence_anyone_elses(client, django_user_model):
    from django.contrib.auth.models import Permission

    ops = _endpoint()
    adder = django_user_model.objects.create_user("adder", password="adder-pass-123", is_staff=True)
    adder.user_permissions.set(Permission.objects.filter(codename="add_webhookendpoint"))
    client.force_login(adder)
    page = client.get(reverse("alerts")).content.decode()
    assert "Add an endpoint" in page and "Disable</button>" not in page and "Send test" not in page
    assert client.post(reverse("enable_webhook_endpoint", args=[ops.pk]), {"enabled": "0"}).status_code == 403
    assert client.post(reverse("test_webhook_endpoint", args=[ops.pk])).status_code == 403
    ops.refresh_from_db()
    assert ops.enabled
