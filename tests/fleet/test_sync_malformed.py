"""The sync against a marketplace whose list of our machines holds entries it cannot fully read (over real HTTP, the
fake RunPod server): one odd entry must neither stop the sync nor make a machine look gone or free."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from fleet import actions
from fleet.instances import ledger
from fleet.models import Alert, Instance
from fleet.providers.records import RentRequest
from fleet.providers.registry import get_provider


pytestmark = pytest.mark.django_db
State = Instance.State


@pytest.fixture
def fake(runpod_market):
    return runpod_market


def _pod(label: str) -> str:
    with get_provider("runpod") as provider:
        return provider.rent(RentRequest(offer_id="NVIDIA H200:SECURE:1", image="ghcr.io/example/worker:cuda12.8",
                                         disk_gb=100, label=label, env={}))


def _row(pod_id: str, key: str, **fields) -> Instance:
    now = timezone.now()
    row = Instance.objects.create(
        provider="runpod", provider_instance_id=pod_id, idempotency_key=key, label=key, offer_id="NVIDIA H200:SECURE:1",
        gpu_name="H200", image="img", disk_gb=100, requested_at=now - timedelta(hours=1),
        **{"state": State.RUNNING, "running_at": now - timedelta(hours=1), "usd_per_hour": Decimal("3.99"), **fields})
    ledger.bill(row, row.usd_per_hour, row.requested_at)
    return row


def _mangle(fake, change):
    """Every pod in the list answers (not a single pod's lookup) goes through change(pod)."""
    def mangle(data):
        for pod in (data.get("myself") or {}).get("pods") or []:
            change(pod)
        return data

    fake.corrupt_answers(mangle)


def test_an_adopted_machine_whose_price_cannot_be_read_is_not_counted_as_free(fake, settings):
    settings.UNKNOWN_PRICE_USD_PER_HOUR = Decimal("8")
    pod_id = _pod(f"{settings.INSTANCE_LABEL_PREFIX}-999999")
    _mangle(fake, lambda pod: pod.update(costPerHr="0.44"))
    report = actions.sync("runpod")
    adopted = Instance.objects.get(provider_instance_id=pod_id)
    assert report.adopted == [adopted.label] and adopted.usd_per_hour == Decimal("8")
    assert ledger.committed_usd_per_hour() == Decimal("8")  # what the spend cap sees
    assert "price is unknown" in adopted.events.get(kind="adopted").message

    fake.corrupt_answers(None)  # the provider gives the price again: billed at it from the start
    actions.sync("runpod")
    adopted.refresh_from_db()
    assert adopted.usd_per_hour == Decimal("3.99")


def test_a_machine_the_list_cannot_name_is_looked_up_alone_not_taken_for_gone(fake):
    listed, unnamed = _pod("moe-fleet-a"), _pod("moe-fleet-b")
    rows = {pod: _row(pod, key) for pod, key in ((listed, "row-a"), (unnamed, "row-b"))}
    _mangle(fake, lambda pod: pod.update(id=None) if pod["id"] == unnamed else None)

    report = actions.sync("runpod")
    assert report.seen == 1 and report.gone == []
    for row in rows.values():
        row.refresh_from_db()
        assert row.state == State.RUNNING and row.last_synced_at is not None  # the unnamed one through its lookup

    fake.kill_pod(unnamed)  # now it is gone for real: its own lookup says so
    report = actions.sync("runpod")
    assert report.gone == ["row-b"]
    rows[unnamed].refresh_from_db()
    assert rows[unnamed].state == State.FAILED


def test_a_stopping_machine_the_list_cannot_name_is_destroyed_not_taken_for_destroyed(fake, settings):
    # The reaper claimed it and handed the destroy over; the list then could not name it. Marking it destroyed on
    # that would stop the queued destroy from ever being sent, and it would bill with no rule looking at it.
    settings.DESTROY_VERIFY_S = 0
    unnamed = _pod("moe-fleet-e")
    row = _row(unnamed, "row-e", state=State.STOPPING, destroy_requested_at=timezone.now() - timedelta(minutes=5),
               destroy_attempts=0)
    _mangle(fake, lambda pod: pod.update(id=None) if pod["id"] == unnamed else None)
    actions.sync("runpod")
    row.refresh_from_db()
    assert unnamed not in fake.pods and row.destroy_attempts == 1
    actions.sync("runpod")  # and now its lookup says it is gone: verified
    row.refresh_from_db()
    assert row.state == State.DESTROYED


def test_a_destroy_is_retried_even_while_another_entry_is_unreadable(fake, settings):
    settings.DESTROY_VERIFY_S = 0
    stuck, odd = _pod("moe-fleet-c"), _pod("moe-fleet-d")
    row = _row(stuck, "row-c", state=State.STOPPING, destroy_requested_at=timezone.now() - timedelta(minutes=5),
               destroy_attempts=1)
    _mangle(fake, lambda pod: pod.update(costPerHr=float("nan")) if pod["id"] == odd else None)
    report = actions.sync("runpod")
    assert report.destroy_retried == ["row-c"] and stuck not in fake.pods
    row.refresh_from_db()
    assert row.destroy_attempts == 2


def test_a_machine_missing_from_one_list_is_asked_for_before_it_is_taken_for_gone(fake):
    pod = _pod("moe-fleet-e")
    row = _row(pod, "row-e")
    # The list answers empty, as one cut short in an incident would; the pod's own lookup is left as served.
    fake.corrupt_answers(lambda data: {**data, "myself": {**data["myself"], "pods": []}} if "myself" in data else data)
    report = actions.sync("runpod")
    assert report.gone == []
    row.refresh_from_db()
    assert row.state == State.RUNNING and row.failure_reason == ""  # its own lookup still finds it


def test_a_machine_listed_again_after_its_row_ended_is_destroyed(fake):
    """A row marked gone (or destroyed) whose machine the provider lists again (no other row of ours holds it or is
    named by its label): it bills, and no rule looks at an ended row, so the sync destroys it."""
    pod = _pod("moe-fleet-f")
    row = _row(pod, "row-f", state=State.FAILED, ended_at=timezone.now(), failure_reason="host lost")
    ledger.stop_billing(row, timezone.now())
    report = actions.sync("runpod")
    assert report.destroy_retried == ["row-f"] and pod not in fake.pods
    row.refresh_from_db()
    assert row.state == State.STOPPING and row.destroy_attempts == 1
    assert "lists it again" in row.events.get(kind="listed-again").message
    assert Alert.objects.filter(kind=Alert.Kind.DESTROY_UNCONFIRMED, instance=row).exists()
    actions.sync("runpod")
    row.refresh_from_db()
    assert row.state == State.DESTROYED


def test_a_kept_box_taken_for_gone_and_listed_again_is_watched_again_not_destroyed(fake):
    pod = _pod("moe-fleet-k")
    row = _row(pod, "row-k", state=State.FAILED, ended_at=timezone.now(), failure_reason="trainer failed",
               keep_until=timezone.now() + timedelta(hours=2))
    ledger.stop_billing(row, timezone.now())
    actions.sync("runpod")
    row.refresh_from_db()
    assert row.state == State.RUNNING and pod in fake.pods and row.cost_segments.filter(ended_at=None).exists()
    assert "kept until" in row.events.get(kind="listed-again").message
    actions.sync("runpod", now=timezone.now() + timedelta(hours=3))  # and when the keep expires, it goes
    row.refresh_from_db()
    assert row.state == State.STOPPING and pod not in fake.pods


def _as_it_was(row: Instance) -> tuple:
    row.refresh_from_db()
    return (row.state, row.usd_per_hour, row.ended_at, row.started_at, row.destroy_attempts,
            list(row.events.values_list("kind", "message")), list(row.cost_segments.values_list("started_at",
                                                                                                "ended_at")))


def _ended(pod_id: str, key: str, **fields) -> Instance:
    row = _row(pod_id, key, state=State.DESTROYED, ended_at=timezone.now() - timedelta(minutes=30),
               usd_per_hour=Decimal("1.23"), **fields)
    ledger.stop_billing(row, row.ended_at)
    return row


def test_a_box_labelled_for_another_of_our_rows_under_an_ended_rows_id_is_neither_destroyed_nor_written_into_it(fake):
    """A marketplace that handed out an ended row's id again, to the box another of our rows rented: that box is not
    the old machine listed again, so it is not destroyed, and the ended row keeps its price and history."""
    waiting = Instance.objects.create(
        provider="runpod", idempotency_key="row-waiting", offer_id="NVIDIA H200:SECURE:1", gpu_name="H200",
        image="img", disk_gb=100, usd_per_hour=Decimal("3.99"), requested_at=timezone.now(),
        rent_attempted_at=timezone.now(), state=State.REQUESTED)
    waiting.label = actions.label_for(waiting)
    waiting.save(update_fields=["label"])
    pod = _pod(waiting.label)
    fake.advance(pod)
    old = _ended(pod, "row-old")
    before = _as_it_was(old)
    report = actions.sync("runpod")
    assert pod in fake.pods and report.destroy_retried == []
    assert _as_it_was(old) == before
    assert not Alert.objects.filter(kind=Alert.Kind.DESTROY_UNCONFIRMED).exists()


def test_a_later_box_under_an_ended_rows_id_that_is_not_ours_is_left_alone(fake):
    """The row knew its machine started hours ago; a box started since, under another name, is someone else's."""
    pod = _pod("a-users-own-box")
    fake.advance(pod)
    old = _ended(pod, "row-old", started_at=timezone.now() - timedelta(hours=3))
    before = _as_it_was(old)
    report = actions.sync("runpod")
    assert pod in fake.pods and report.destroy_retried == [] and report.adopted == []
    assert _as_it_was(old) == before


def test_fields_longer_than_their_columns_neither_fail_the_row_nor_stop_the_sync(fake, settings):
    settings.DESTROY_VERIFY_S = 0
    odd, stuck = _pod("moe-fleet-g"), _pod("moe-fleet-h")
    fake.advance(odd)  # booted: its runtime lists its ports
    odd_row = _row(odd, "row-g")
    _row(stuck, "row-h", state=State.STOPPING, destroy_attempts=1,
         destroy_requested_at=timezone.now() - timedelta(minutes=5))

    def long_fields(pod):
        if pod["id"] == odd:
            pod["lastStatusChange"] = "Rented by User: " + "x" * 5000
            for port in (pod.get("runtime") or {}).get("ports") or []:
                port["ip"] = "203.0.113." + "9" * 90
    _mangle(fake, long_fields)
    report = actions.sync("runpod")
    assert report.destroy_retried == ["row-h"] and stuck not in fake.pods
    odd_row.refresh_from_db()
    assert odd_row.state == State.RUNNING and odd_row.last_synced_at is not None
    assert len(odd_row.status_msg) == 2000 and odd_row.public_ip.startswith("203.0.113.")


def test_a_machine_neither_its_entry_nor_its_lookup_can_name_is_left_as_it_was_and_the_rest_sync(fake, caplog):
    junk, fine = _pod("moe-fleet-m"), _pod("moe-fleet-n")
    fake.advance()
    junk_row, fine_row = _row(junk, "row-m"), _row(fine, "row-n")

    def mangle(data):
        pods = (data.get("myself") or {}).get("pods") or []
        for pod in pods + [data.get("pod") or {}]:  # the list, and the pod's own lookup
            if pod.get("id") == junk:
                pod["id"] = None
        return data
    fake.corrupt_answers(mangle)
    report = actions.sync("runpod")
    assert report.seen == 1 and report.gone == [] and report.failed == []
    junk_row.refresh_from_db()
    fine_row.refresh_from_db()
    assert (junk_row.state, junk_row.last_synced_at, junk_row.failure_reason, junk_row.provider_status) == (
        State.RUNNING, None, "", "")  # as it was: not gone, not failed
    assert junk_row.cost_segments.filter(ended_at=None).exists() and junk in fake.pods  # still billed, not destroyed
    assert fine_row.last_synced_at is not None and fine_row.provider_status == "running"
    assert Instance.objects.count() == 2 and not Alert.objects.filter(kind=Alert.Kind.INSTANCE_FAILED).exists()
    assert "left for the next sync" in caplog.text

    fake.corrupt_answers(None)
    actions.sync("runpod")
    junk_row.refresh_from_db()
    assert junk_row.state == State.RUNNING and junk_row.last_synced_at is not None


def _lost_rent(label_of_pod: str | None = None) -> Instance:
    """A row whose rent reached RunPod but whose answer was lost (it waits to be found by its label), an hour ago."""
    now = timezone.now()
    row = Instance.objects.create(
        provider="runpod", idempotency_key="lost", offer_id="NVIDIA H200:SECURE:1", gpu_name="H200", image="img",
        disk_gb=100, usd_per_hour=Decimal("3.99"), requested_at=now - timedelta(hours=1),
        rent_attempted_at=now - timedelta(hours=1))
    row.label = actions.label_for(row)
    row.save(update_fields=["label"])
    return row


def test_a_lost_rent_is_not_taken_for_never_rented_while_an_entry_that_may_be_it_cannot_be_read(fake, caplog):
    row = _lost_rent()
    pod = _pod(row.label)  # rented after all: it bills
    _mangle(fake, lambda listed: listed.update(id=None) if listed["id"] == pod else None)
    report = actions.sync("runpod")
    row.refresh_from_db()
    assert report.failed == [] and row.state == State.REQUESTED and row.ended_at is None
    assert not row.events.filter(kind=State.FAILED).exists()  # no "never rented", so nothing rents its work again
    assert f"{row.label} (rent outcome unknown) left as it was" in caplog.text

    fake.corrupt_answers(None)  # the entry reads again: the machine is found by its label
    report = actions.sync("runpod")
    row.refresh_from_db()
    assert report.adopted == [row.label] and row.provider_instance_id == pod and row.state == State.PROVISIONING


def test_an_unreadable_entry_that_is_plainly_another_machine_holds_no_lost_rent(fake):
    row = _lost_rent()
    other = _pod("someone-else")
    _mangle(fake, lambda listed: listed.update(id=None) if listed["id"] == other else None)
    report = actions.sync("runpod")
    row.refresh_from_db()
    assert report.failed == [row.label] and row.state == State.FAILED  # its label was readable, and not this row's
    assert "Never rented" in row.events.get(kind=State.FAILED).message
