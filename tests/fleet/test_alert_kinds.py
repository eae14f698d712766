"""Every alert says what happened: a test is a test (sent and logged as such), and one receiver is one endpoint."""

import json
import re

import pytest
from django.urls import reverse

from fleet.alerts import notify, webhooks
from fleet.models import Alert, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db
NEW = {"name": "ops", "url": "https://hooks.example.com/T000/B000/abcdef", "events": ["run.failed"]}


def field_errors(page: str, field: str) -> list[str]:
    """The messages shown right after the field's label."""
    after = page.split(f'name="{field}"', 1)[1]
    block = re.match(r'[^>]*>\s*</label>\s*(<ul class="errorlist"[^>]*>.*?</ul>)?', after, re.S)
    return re.findall(r"<li>(.*?)</li>", block.group(1) or "") if block else []


def test_it_sends_and_logs_a_test_alert_as_a_test(client, staff):
    ops = notify.create_endpoint(name="ops", url="https://hooks.example.com/x", events=["run.failed"], slack=False)
    client.force_login(staff)
    client.post(reverse("test_webhook_endpoint", args=[ops.pk]))
    delivery = WebhookDelivery.objects.select_related("alert").get()
    assert delivery.endpoint == ops and delivery.alert.kind == Alert.Kind.TEST == "test"
    assert json.loads(webhooks.body(delivery.alert, slack=False))["type"] == "test"
    assert webhooks.body(delivery.alert, slack=True).decode().startswith('{"text":"[test] Test alert to ops')
    log = client.get(reverse("alerts")).content.decode().split('id="recent-alerts"')[1]
    assert '<span class="tag">test</span>' in log and "instance.rented" not in log and "run.failed" not in log


def test_it_offers_no_test_kind_to_subscribe_to(client, staff):
    client.force_login(staff)
    page = client.get(reverse("alerts")).content.decode()
    assert 'value="run.cancelled"' in page and 'value="test"' not in page


@pytest.mark.parametrize("same", ["https://hooks.example.com/T000/B000/abcdef",
                                  "HTTPS://Hooks.Example.com/T000/B000/abcdef",
                                  "https://hooks.example.com:443/T000/B000/abcdef"])
@pytest.mark.parametrize("enabled", [True, False])
def test_it_refuses_a_second_endpoint_for_one_url_with_the_reason_by_the_field(client, staff, same, enabled):
    first = notify.create_endpoint(name="ops", url=NEW["url"], events=[], slack=False)
    WebhookEndpoint.objects.filter(pk=first.pk).update(enabled=enabled)
    client.force_login(staff)
    response = client.post(reverse("add_webhook_endpoint"), {**NEW, "name": "ops-again", "url": same})
    assert response.status_code == 400 and WebhookEndpoint.objects.count() == 1
    page = response.content.decode()
    [message] = field_errors(page, "url")
    assert "The endpoint &#x27;ops&#x27; posts to this URL already" in message
    assert ("enable it instead" in message) is not enabled
    assert "T000/B000" not in page.split('id="webhook-endpoints"')[0] + message  # the secret path is not repeated


def test_it_takes_another_path_on_the_same_host(client, staff):
    notify.create_endpoint(name="ops", url=NEW["url"], events=[], slack=False)
    client.force_login(staff)
    response = client.post(reverse("add_webhook_endpoint"), {**NEW, "name": "dev", "url": NEW["url"] + "-dev"})
    assert response.status_code == 201 and WebhookEndpoint.objects.count() == 2


@pytest.mark.parametrize("url, message", [("not a url", "Enter a valid URL."),
                                          ("ftp://example.com/x", "Use an http:// or https:// URL.")])
def test_it_says_once_why_a_url_is_refused(client, staff, url, message):
    client.force_login(staff)
    response = client.post(reverse("add_webhook_endpoint"), {**NEW, "url": url})
    assert response.status_code == 400
    assert field_errors(response.content.decode(), "url") == [message]
