"""What a user sees and may do on the Instances pages: rent and destroy with the permission, 403 without it."""

import re
import time

import pytest
from django.test import Client
from django.urls import reverse

from fleet import actions
from fleet.models import Instance, Offer
from fleet.offers.refresh import refresh_offers
from fleet.ranking.price import per_hour, rental_price
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture
def offer(market):
    refresh_offers()
    return Offer.objects.filter(available=True, is_bid=False, cuda_max__gte=12.8, disk_gb__gte=100).order_by(
        "total_usd_per_hour").first()


def _rent_url(offer):
    return f"{reverse('rent_confirm')}?provider=vast&offer={offer.offer_id}&bid=0"


def _confirm(client, offer):
    page = client.get(_rent_url(offer)).content.decode()
    key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', page).group(1)
    return page, {"provider": "vast", "offer": offer.offer_id, "bid": "0", "idempotency_key": key,
                  "image": "ghcr.io/example/worker:cuda12.4", "disk_gb": "100",
                  "quoted_disk_gb": "100"}  # as if the page had been shown again with 100 GB's price


def test_it_shows_what_will_be_rented_before_renting(client, staff, offer):
    client.force_login(staff)
    page, _ = _confirm(client, offer)
    assert f"Rent offer {offer.offer_id}?" in page
    assert per_hour(rental_price(offer, 250).usd_per_hour) in page and "on-demand" in page
    assert 'name="image"' in page and 'value="250"' in page  # the default disk
    assert not Instance.objects.exists()  # looking rents nothing


def test_it_rents_through_a_celery_worker_once_per_confirmation(staff, offer, celery_worker):
    client = Client()
    client.force_login(staff)
    _, form = _confirm(client, offer)
    first = client.post(reverse("rent_confirm"), form)
    second = client.post(reverse("rent_confirm"), form)  # a double click sends the same key
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"]
    instance = Instance.objects.get()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and instance.provider_instance_id is None:
        time.sleep(0.2)
        instance.refresh_from_db()
    assert instance.state == Instance.State.PROVISIONING and instance.disk_gb == 100
    page = client.get(first["Location"]).content.decode()
    assert "provisioning" in page and instance.provider_instance_id in page


def test_it_hides_the_buttons_and_refuses_a_member(client, member, offer):
    client.force_login(member)
    ranking = client.get(reverse("offers"), {"max_usd_per_hour": "6"}).content.decode()
    assert "Rent</a>" not in ranking
    assert client.get(_rent_url(offer)).status_code == 403
    response = client.post(reverse("rent_confirm"), {"provider": "vast", "offer": offer.offer_id, "bid": "0",
                                                     "idempotency_key": "x", "image": "i", "disk_gb": "100"})
    assert response.status_code == 403 and not Instance.objects.exists()
    instance, _ = actions.request_rent(offer=offer, idempotency_key="k")
    assert client.get(reverse("instance_detail", args=[instance.pk])).status_code == 404  # no run of theirs on it
    assert client.post(reverse("destroy_confirm", args=[instance.pk])).status_code == 403
    assert client.post(reverse("keep_for_debugging", args=[instance.pk]), {"hours": 2}).status_code == 403


def test_it_refuses_staff_without_the_permission(client, django_user_model, offer):
    client.force_login(django_user_model.objects.create_user("clerk", password="pw-clerk-123", is_staff=True))
    assert client.get(_rent_url(offer)).status_code == 403


def test_it_needs_the_csrf_token_to_rent(staff, offer):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    _, form = _confirm(client, offer)
    assert client.post(reverse("rent_confirm"), form).status_code == 403
    assert not Instance.objects.exists()


def _wait_for_state(instance, state, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        instance.refresh_from_db()
        if instance.state == state:
            return instance
        time.sleep(0.2)
    raise AssertionError(f"{instance.label} is {instance.state}, not {state}")


def test_it_destroys_from_the_dashboard(staff, offer, celery_worker):
    client = Client()
    client.force_login(staff)
    instance, _ = actions.request_rent(offer=offer, idempotency_key="k", disk_gb=100)
    instance = actions.rent(instance.pk)
    assert "Destroy</a>" in client.get(reverse("instance_detail", args=[instance.pk])).content.decode()
    confirm = client.get(reverse("destroy_confirm", args=[instance.pk])).content.decode()
    assert f"Destroy {instance.label}?" in confirm
    client.post(reverse("destroy_confirm", args=[instance.pk]))
    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPING  # recorded before the worker's call
    assert "by staff from the dashboard" in instance.destroy_reason
    wait_until(lambda: Instance.objects.get(pk=instance.pk).destroy_attempts == 1, "the worker's destroy call")
    actions.sync()
    assert _wait_for_state(instance, Instance.State.DESTROYED)


def test_it_lists_live_instances_with_their_cost(client, staff, offer):
    instance, _ = actions.request_rent(offer=offer, idempotency_key="k", disk_gb=100)
    actions.rent(instance.pk)
    client.force_login(staff)  # staff see every box
    page = client.get(reverse("instances")).content.decode()
    assert instance.label in page and 'hx-trigger="every 5s"' in page
    partial = client.get(reverse("instances"), HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and instance.label in partial
    rate = re.search(rf'data-instance="{instance.pk}".*?data-rate="([\d.]+)"', partial, re.S).group(1)
    assert float(rate) == pytest.approx(float(instance.usd_per_hour))  # the live cost ticks at its price


def test_it_keeps_an_instance_for_a_bounded_time(client, staff, offer, settings):
    instance, _ = actions.request_rent(offer=offer, idempotency_key="k")
    client.force_login(staff)
    client.post(reverse("keep_for_debugging", args=[instance.pk]), {"hours": "500"})
    instance.refresh_from_db()
    assert instance.keep_until is None  # more than the maximum is refused, not stretched
    client.post(reverse("keep_for_debugging", args=[instance.pk]), {"hours": "3"})
    instance.refresh_from_db()
    assert instance.keep_until is not None


def test_it_destroys_from_the_admin_after_confirmation(staff, offer, celery_worker):
    instance, _ = actions.request_rent(offer=offer, idempotency_key="k", disk_gb=100)
    instance = actions.rent(instance.pk)
    client = Client()
    client.force_login(staff)
    changelist = reverse("admin:fleet_instance_changelist")
    confirm = client.post(changelist, {"action": "destroy", "_selected_action": [instance.pk]})
    assert confirm.status_code == 200 and "Yes, destroy" in confirm.content.decode()
    instance.refresh_from_db()
    assert instance.state == Instance.State.PROVISIONING, list(instance.events.values_list("message", flat=True))
    client.post(changelist, {"action": "destroy", "_selected_action": [instance.pk], "confirmed": "yes"})
    instance = _wait_for_state(instance, Instance.State.STOPPING)
    assert instance.destroy_reason == "destroyed by staff from the admin"


def test_it_offers_no_admin_destroy_without_the_permission(client, django_user_model, offer):
    clerk = django_user_model.objects.create_user("clerk", password="pw-clerk-123", is_staff=True)
    from django.contrib.auth.models import Permission

    clerk.user_permissions.add(Permission.objects.get(codename="view_instance"))
    client.force_login(clerk)
    page = client.get(reverse("admin:fleet_instance_changelist")).content.decode()
    assert 'value="destroy"' not in page


def test_a_rent_form_cannot_take_a_key_the_product_rents_under(client, staff, offer):
    # The product's own rents use keys anyone can guess (a run's attempt, a replica's slot): a form naming one would
    # leave that work waiting on a box it never gets.
    client.force_login(staff)
    _, form = _confirm(client, offer)
    page = client.post(reverse("rent_confirm"), {**form, "idempotency_key": "run-5-attempt-0"}).content.decode()
    assert "This form is not one the page made" in page and not Instance.objects.exists()
    client.post(reverse("rent_confirm"), form)
    assert Instance.objects.get().idempotency_key == f"manual-{staff.pk}-{form['idempotency_key']}"
