"""Two runs launched together both rank the same best offer first: the second's rent finds it taken by the first.
The product rents the next offer by itself, so that is an event on the box, not a red instance.failed alert."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Alert, Instance, InstanceEvent
from runs.models import Run
from tests.runs.test_supervisor import _supervise

pytestmark = pytest.mark.django_db


@pytest.fixture
def offers(frozen_market):
    from fleet.offers.refresh import refresh_offers

    refresh_offers()


def test_a_taken_offer_is_no_alert_and_the_next_one_is_rented(launched, frozen_market, offers):
    first = launched(name="first")
    launched(name="second")
    now = timezone.now()
    _supervise(first, now)  # one pass over both runs: both ask for the best offer
    [taken] = Instance.objects.filter(state=Instance.State.FAILED)
    [renter] = Instance.objects.filter(state=Instance.State.PROVISIONING)
    assert taken.offer_id == renter.offer_id  # the second asked for the offer the first had just rented
    assert InstanceEvent.objects.filter(instance=taken, kind="offer-taken").exists()
    _supervise(first, now + timedelta(seconds=30))
    assert sorted(Run.objects.values_list("state", flat=True)) == ["provisioning", "provisioning"]
    assert Instance.objects.filter(state=Instance.State.PROVISIONING).exclude(offer_id=taken.offer_id).count() == 1
    assert not Alert.objects.filter(kind=Alert.Kind.INSTANCE_FAILED).exists()
