"""The projected finish rests on the median of the newest steps, so one slow step (a checkpoint's) does not move it,
and it says its uncertainty: the run finishes in a range, from the steps' lower to their upper quartile."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import MetricPoint, Run
from runs.projection import span_words, step_time
from runs.run_data import projections
from tests.runs.seeding import seed_run
from tests.runs.test_projection_agrees import list_row, page_cards


def test_one_slow_step_does_not_set_the_step_time():
    steady = [55.0] * 20
    assert step_time(steady).typical_s == step_time([*steady, 600.0]).typical_s == 55.0


def test_the_range_runs_from_the_lower_to_the_upper_quartile():
    estimate = step_time([50.0, 60.0, 50.0, 60.0, 55.0])
    assert (estimate.low_s, estimate.typical_s, estimate.high_s) == (50.0, 55.0, 60.0)


@pytest.mark.parametrize("low_s, high_s, words", [
    (12 * 60, 15 * 60, "12–15 min"), (40, 55, "40–55 s"), (9000, 11000, "2.5–3.1 h"), (5 * 86400, 6 * 86400,
                                                                                       "5–6 days"),
    (14 * 60 + 5, 14 * 60 + 10, "14 min")])
def test_a_span_reads_in_one_unit(low_s, high_s, words):
    assert span_words(low_s, high_s) == words


def _run_at_step(run, step):
    Run.objects.filter(pk=run.pk).update(current_phase=2, current_step=step)
    run.refresh_from_db()
    return run


@pytest.mark.django_db
def test_a_slow_step_does_not_push_the_projected_finish_later():
    now = timezone.now()
    run = seed_run("steady", state="training", now=now)
    MetricPoint.objects.filter(run=run, phase=2, step__gt=20).delete()
    before = projections([_run_at_step(run, 20)], now)[run.pk]
    point = MetricPoint.objects.get(run=run, phase=2, step=20)
    point.pk, point.step, point.step_s, point.at = None, 21, 600.0, point.at + timedelta(seconds=600)
    point.save()
    after = projections([_run_at_step(run, 21)], now)[run.pk]
    assert after.finish_at <= before.finish_at


@pytest.mark.django_db
def test_the_runs_list_and_the_run_page_say_the_finish_as_a_range(client, operator, monkeypatch):
    moment = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: moment)
    client.force_login(operator)
    run = seed_run("varied", state="training", now=moment)
    for point in MetricPoint.objects.filter(run=run, phase=2):
        point.step_s = 50.0 if point.step % 2 else 62.0
        point.save(update_fields=["step_s"])
    _run_at_step(run, 10)
    eta = list_row(client, run)["ETA"]
    low, high = map(int, re.fullmatch(r"(\d+)–(\d+) min", eta).groups())
    assert (low, high) == (round(50 * 20 / 60), round(62 * 20 / 60))  # 20 steps to go at 50 to 62 s a step
    assert page_cards(client, run)["Projected finish"][1] == f"in {eta}"
