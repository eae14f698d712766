"""A run's state words say what is really happening to its box: a training run whose box is stopping is not shown
as training, and a recovering run says which step of the recovery it is at (run page and runs list)."""

import re

import pytest

from fleet.models import Instance
from runs.models import Run
from tests.runs.conftest import put_on_a_box

pytestmark = pytest.mark.django_db


def _shown(client, run) -> tuple[str, str]:
    """The state words in the run page's heading and in the run's row of the runs list."""
    page = client.get(f"/runs/{run.pk}/").content.decode()
    heading = re.search(r'<h1>.*?<span class="state [^"]*">([^<]*)</span>', page, re.S).group(1)
    listing = client.get("/runs/").content.decode()
    row = re.search(rf'<tr data-run="{run.pk}">.*?<span class="state [^"]*">([^<]*)</span>', listing, re.S).group(1)
    return heading, row


def test_a_training_run_whose_box_is_stopping_says_so(launched, client, operator):
    client.force_login(operator)
    run = launched()
    put_on_a_box(run)
    Run.objects.filter(pk=run.pk).update(state="training")
    assert _shown(client, run) == ("training", "training")
    Instance.objects.filter(pk=run.current_instance_id).update(state=Instance.State.STOPPING)
    assert _shown(client, run) == ("box stopping", "box stopping")
    page = client.get(f"/runs/{run.pk}/").content.decode()
    now = re.search(r'<dd id="run-now">([^<]*)</dd>', page).group(1)
    assert "stopping" in now and not now.startswith("Training")


def test_a_recovering_run_on_its_new_box_says_the_box_provisions(launched, client, operator):
    client.force_login(operator)
    run = launched()
    put_on_a_box(run)
    Run.objects.filter(pk=run.pk).update(state="provisioning", restarts=1)
    Instance.objects.filter(pk=run.current_instance_id).update(state=Instance.State.PROVISIONING)
    assert _shown(client, run) == ("recovering: new box provisioning", "recovering: new box provisioning")


def test_a_recovering_run_without_a_box_says_it_looks_for_one(launched, client, operator):
    client.force_login(operator)
    run = launched()
    Run.objects.filter(pk=run.pk).update(state="recovering", restarts=1)
    assert _shown(client, run) == ("recovering: renting a new box", "recovering: renting a new box")

