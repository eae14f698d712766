"""The simulated marketplace's demo webhook receiver: on the embedded default the Alerts page takes it (and no other
private address), a test alert lands there signed, and its listing checks the signature with the endpoint's secret."""

import re

import httpx
import pytest
from django.urls import reverse

from fleet.alerts import notify
from fleet.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def embedded_market(market, _market_server, settings):
    settings.SIMULATOR_ENABLED = True
    settings.SIMULATOR_HOST, settings.SIMULATOR_PORT = "127.0.0.1", _market_server.port
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    return _market_server


def _add(client, url: str, name: str = "demo"):
    return client.post(reverse("add_webhook_endpoint"), {"name": name, "url": url})


def test_a_test_alert_lands_signed_at_the_demo_receiver(client, operator, embedded_market):
    client.force_login(operator)
    page = client.get(reverse("alerts")).content.decode()
    receiver = f"http://127.0.0.1:{embedded_market.port}/_sim/webhooks/demo"
    assert f"<code>{receiver}</code>" in page
    added = _add(client, receiver)
    assert added.status_code == 201, added.content.decode()[-3000:]
    shown = added.content.decode()
    secret = re.search(r'<code class="secret">(whsec_[^<]+)</code>', shown).group(1)
    listing = re.search(r'<code class="copy-text" id="demo-listing">([^<]+)</code>', shown).group(1)
    assert listing == f"curl -H 'webhook-secret: {secret}' {receiver}"
    endpoint = WebhookEndpoint.objects.get()
    client.post(reverse("test_webhook_endpoint", args=[endpoint.pk]))
    delivery = WebhookDelivery.objects.get()
    assert notify.deliver(delivery.pk).state == WebhookDelivery.State.SENT
    landed = httpx.get(receiver, headers={"webhook-secret": secret}, timeout=5).json()["deliveries"]
    assert [(d["webhook-id"], d["signature"], d["body"]["type"]) for d in landed] == [
        (delivery.message_id, "valid", "test")]
    wrong = httpx.get(receiver, headers={"webhook-secret": "whsec_" + "A" * 32}, timeout=5).json()["deliveries"]
    assert wrong[0]["signature"] == "no v1 signature matches the secret"
    assert httpx.get(receiver, timeout=5).json()["deliveries"][0]["signature"].startswith("not checked")
    _refuses_every_other_private_address(client, embedded_market)


def _refuses_every_other_private_address(client, embedded_market):
    base = f"http://127.0.0.1:{embedded_market.port}"
    for url in (f"{base}/_sim/instances/1/kill", f"{base}/_sim/webhooks/../instances/1/kill",
                f"{base}/_sim/webhooks/demo?x=1", f"http://127.0.0.1:{embedded_market.port + 1}/_sim/webhooks/demo",
                "http://10.0.0.7/_sim/webhooks/demo", f"http://user:pw@127.0.0.1:{embedded_market.port}/_sim/webhooks/d"):
        answer = _add(client, url, name="elsewhere")
        assert answer.status_code == 400 and "This URL is not allowed" in answer.content.decode(), url
    assert WebhookEndpoint.objects.count() == 1


def test_it_is_taken_only_while_the_simulated_marketplace_is_enabled(client, operator, embedded_market, settings):
    client.force_login(operator)
    assert _add(client, f"http://127.0.0.1:{embedded_market.port}/_sim/webhooks/first").status_code == 201
    settings.SIMULATOR_ENABLED = False
    assert 'id="demo-receiver"' not in client.get(reverse("alerts")).content.decode()
    answer = _add(client, f"http://127.0.0.1:{embedded_market.port}/_sim/webhooks/second")
    assert answer.status_code == 400 and "is a loopback address" in answer.content.decode()
