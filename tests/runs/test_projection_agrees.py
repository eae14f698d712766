"""The runs list and a run's page show one projection: the same step time, cost per steps, cost so far, projected
total and finish, read at the same moment."""

import re

import pytest
from django.urls import reverse
from django.utils import timezone

from runs.models import MetricPoint, Run
from tests.runs.seeding import seed_run


def _text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def list_row(client, run) -> dict[str, str]:
    body = client.get(reverse("runs")).content.decode()
    headers = [_text(h) for h in re.findall(r"<th>(.*?)</th>", body, re.S)]
    row = re.search(rf'<tr data-run="{run.pk}">(.*?)</tr>', body, re.S).group(1)
    return dict(zip(headers, (_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)), strict=True))


def page_cards(client, run) -> dict[str, tuple[str, str]]:
    summary = client.get(reverse("run_chart_data", args=[run.pk])).json()["summary_html"]
    cards = re.findall(r'<div class="card[^"]*"><h2>(.*?)</h2><p class="figure[^"]*"[^>]*>(.*?)</p><p>(.*?)</p>',
                       summary, re.S)
    return {_text(title): (_text(figure), _text(words)) for title, figure, words in cards}


def price_per_steps(figures: dict, *names: str) -> str:
    return next(value for name, value in figures.items() if name in names)


@pytest.fixture
def at_one_moment(monkeypatch):
    moment = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: moment)
    return moment


@pytest.fixture
def logged_in(client, operator):
    client.force_login(operator)  # the seeded runs are no one's: an operator's to see
    return client


def slow_newest_step(run):
    # A checkpoint's step: the newest point alone is far slower than the steps around it.
    MetricPoint.objects.filter(run=run, phase=2, step=30).update(step_s=140.0)


def between_boxes(run):
    # The host was lost: the run waits for its next box, with no current one.
    Run.objects.filter(pk=run.pk).update(state="recovering", current_instance=None)


@pytest.mark.django_db
@pytest.mark.parametrize("situation", [slow_newest_step, between_boxes])
def test_it_shows_the_same_figures_in_the_runs_list_and_on_the_run_page(logged_in, at_one_moment, situation):
    run = seed_run("agrees", state="training")
    Run.objects.filter(pk=run.pk).update(current_phase=1, current_step=10)
    situation(run)

    row, cards = list_row(logged_in, run), page_cards(logged_in, run)

    assert row["Step time"] == cards["Step time"][0] != "–"
    assert price_per_steps(row, "$/step", "$/1k steps") == price_per_steps(
        {name: figure for name, (figure, _) in cards.items()}, "Cost per step", "Cost per 1k steps") != "–"
    assert row["Cost so far"] == cards["Cost so far"][0]
    assert row["Projected total"] == cards["Projected total"][0] != "–"
    assert cards["Projected finish"][1] == f"in {row['ETA']}"


@pytest.mark.django_db
def test_it_shows_the_run_pages_cost_so_far_in_its_state_and_its_figures(logged_in, at_one_moment):
    run = seed_run("agrees", state="training")
    page = logged_in.get(reverse("run_detail", args=[run.pk])).content.decode()
    cost = _text(re.search(r"<dt>Cost</dt><dd>(.*?) of ", page, re.S).group(1))
    assert cost == page_cards(logged_in, run)["Cost so far"][0] == list_row(logged_in, run)["Cost so far"]
