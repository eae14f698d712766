"""The run pages never fail on a value already stored: a step count no run will reach, a step time a box reported
as NaN or an infinity. The projection says "unknown" instead of a date past any calendar."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.urls import reverse

from runs import projection
from runs.models import MetricPoint, Phase
from tests.runs.seeding import seed_run

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
LARGEST_STORED_STEPS = 2_147_483_647  # PostgreSQL's integer column; SQLite stores the recipe's 10**15 as it is


@pytest.fixture
def logged_in(client, operator):
    client.force_login(operator)  # the seeded runs are no one's: an operator's to see
    return client


@pytest.mark.parametrize("steps", [10**15, 10**400])
def test_it_projects_no_date_for_a_run_that_would_not_end(steps):
    p = projection.project(planned=[steps], current_phase=0, current_step=10, step_s=0.5,
                           usd_per_hour=Decimal("1.20"), cost_usd=Decimal("0.10"), now=T0, active=True)
    assert p.beyond_horizon and p.finish_at is None and p.total_usd is None
    assert p.usd_per_1k_steps == Decimal("1.20") * Decimal("0.5") / 3600 * 1000 and p.percent < 1e-10


@pytest.mark.parametrize("step_s", [float("nan"), float("inf"), -1.0])
def test_it_treats_an_unusable_step_time_as_unknown(step_s):
    p = projection.project(planned=[100], current_phase=0, current_step=10, step_s=step_s,
                           usd_per_hour=Decimal("1.20"), cost_usd=Decimal("0.10"), now=T0, active=True)
    assert p.step_s is None and p.finish_at is None and p.total_usd is None and not p.beyond_horizon


def huge_run():
    run = seed_run("huge", state="training")
    Phase.objects.filter(run=run, index=2).update(steps=LARGEST_STORED_STEPS)
    MetricPoint.objects.filter(run=run, phase=2).update(step_s=1e6)
    return run


def nan_step_times():
    run = seed_run("nan", state="training")
    MetricPoint.objects.filter(run=run, phase=2, step__gt=20).update(step_s=float("nan"))
    return run


def infinite_step_times():
    run = seed_run("inf", state="training")
    MetricPoint.objects.filter(run=run, phase=2, step=30).update(step_s=float("inf"), tokens_per_s=float("-inf"))
    return run


@pytest.mark.django_db
@pytest.mark.parametrize("seed", [huge_run, nan_step_times, infinite_step_times])
def test_it_serves_the_runs_list_the_run_page_and_its_charts_whatever_is_stored(logged_in, seed):
    run = seed()
    listed = logged_in.get(reverse("runs"))
    page = logged_in.get(reverse("run_detail", args=[run.pk]))
    charts = logged_in.get(reverse("run_chart_data", args=[run.pk]))
    assert (listed.status_code, page.status_code, charts.status_code) == (200, 200, 200)
    assert "NaN" not in charts.content.decode() and "Infinity" not in charts.content.decode()  # JSON has neither
    if seed is huge_run:
        assert "unknown (over 10 years)" in listed.content.decode()
        assert "would not end within 10 years" in charts.json()["summary_html"]
