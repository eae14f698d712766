"""A recovery is visible while it happens: from the lost box until training resumes on the new one the run is shown
as recovering (run page, runs list, dashboard count), and every restart alerts, a hung box's too."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Alert
from runs import supervisor
from tests.runs.test_supervisor import Agent, _supervise

pytestmark = pytest.mark.django_db


@pytest.fixture
def offers(frozen_market):
    from fleet.offers.refresh import refresh_offers

    refresh_offers()


def _dashboard_count(client, state):
    import re

    page = client.get("/").content.decode()
    found = re.search(rf'state-{state}">{state}</span> (\d+)', page)
    return int(found.group(1)) if found else None


def test_a_run_on_its_new_box_shows_as_recovering_until_it_trains_again(launched, frozen_market, offers, settings,
                                                                        client, operator):
    client.force_login(operator)
    run = _supervise(launched())
    Agent(frozen_market, run).starts_training()
    assert _dashboard_count(client, "recovering") == 0
    run = _supervise(run, timezone.now() + timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S + 1))
    assert run.state == "provisioning" and run.shown_state == "recovering"
    assert _dashboard_count(client, "recovering") == 1
    assert "recovering" in client.get(f"/runs/{run.pk}/").content.decode()
    alert = Alert.objects.get(kind=Alert.Kind.RUN_RECOVERING)
    assert f"#{run.pk}" in alert.message and "restart 1 of at most 3" in alert.message
    agent = Agent(frozen_market, run)
    agent.starts_training()
    run.refresh_from_db()
    assert run.shown_state == "training" and _dashboard_count(client, "recovering") == 0


def test_a_hung_box_alerts_as_a_restart(launched, frozen_market, offers, settings):
    run = _supervise(launched())
    agent = Agent(frozen_market, run)
    agent.starts_training()
    agent.steps(1)
    box = run.current_instance
    box.gpu_util_percent = 0.0
    box.save(update_fields=["gpu_util_percent"])
    supervisor.on_move(box, "GPU idle for 30 min", timezone.now())
    assert Alert.objects.filter(kind=Alert.Kind.RUN_RECOVERING, message__contains="hung").count() == 1
