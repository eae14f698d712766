"""The run page names its current box's provider id and, on the embedded default while the run is active, the
simulated marketplace's kill and hang commands for it, ready to copy; only for those who see the run."""

import re

import pytest
from django.urls import reverse

from runs.models import Run
from tests.runs.conftest import put_on_a_box

pytestmark = pytest.mark.django_db


@pytest.fixture
def embedded(settings):
    settings.SIMULATOR_ENABLED, settings.SIMULATOR_HOST, settings.SIMULATOR_PORT = True, "127.0.0.1", 8765


def _commands(html: str) -> dict[str, str]:
    return dict(re.findall(r'<code class="copy-text" id="(\w+)-command">([^<]+)</code> <button type="button" '
                           r'class="copy" data-copy="\1-command">Copy</button>', html))


def test_it_shows_the_box_id_and_the_commands_to_kill_or_hang_it(client, launched, member, bob, embedded):
    run = launched(user=member)
    put_on_a_box(run)
    run.current_instance.provider_instance_id = "31337"
    run.current_instance.save()
    client.force_login(member)  # the run's owner, not staff: the box that trains their run is theirs to see
    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert '<code id="box-provider-id">31337</code>' in page
    assert _commands(page) == {"kill": "curl -X POST http://127.0.0.1:8765/_sim/instances/31337/kill",
                               "hang": "curl -X POST http://127.0.0.1:8765/_sim/instances/31337/hang"}
    assert "js/copy-text.js" in page
    live = client.get(reverse("run_detail", args=[run.pk]) + "?part=box", HTTP_HX_REQUEST="true").content.decode()
    assert _commands(live) == _commands(page) and "<html" not in live
    client.force_login(bob)  # staff, but not the run's owner nor an operator
    assert client.get(reverse("run_detail", args=[run.pk]) + "?part=box", HTTP_HX_REQUEST="true").status_code == 404


def test_it_shows_no_commands_off_the_simulated_marketplace_or_once_the_run_ended(client, launched, alice, settings,
                                                                                 embedded):
    run = launched(user=alice)
    put_on_a_box(run)
    run.current_instance.provider_instance_id = "77"
    run.current_instance.save()
    client.force_login(alice)
    settings.SIMULATOR_ENABLED = False
    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert '<code id="box-provider-id">77</code>' in page and _commands(page) == {}
    settings.SIMULATOR_ENABLED = True
    Run.objects.filter(pk=run.pk).update(state=Run.State.FINISHED)
    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert '<code id="box-provider-id">77</code>' in page and _commands(page) == {}

