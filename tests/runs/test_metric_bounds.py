"""Every number a box posts has a largest value: a step time of 1e308 is refused, and one already stored (before the
bound) leaves every page that shows the run working, for every user."""

import json

import pytest
from django.test import Client
from django.urls import reverse

from runs.models import MetricPoint
from tests.runs.conftest import put_on_a_box
from tests.runs.seeding import seed_run
from training import metric_fields

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"
NUMBERS = [f for f in metric_fields.FIELDS if f.kind is not str]


def _point(step, **fields):
    return {"phase": 0, "step": step, "loss": 2.5, "lr": 1e-4, "step_s": 0.5, "tokens_per_s": 512.0,
            "grad_norm_routed": 0.3, "grad_norm_total": 0.36, "routed_b_norm": 0.01, "routed_b_zero": 0,
            "gpu_mem_gib": 1.5, "kernel_path": "loop", **fields}


def _post_points(run, points):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    return client.post(API + "/metrics", json.dumps({"points": points}), content_type="application/json")


def _named(response) -> set[str]:
    return {str(part) for error in response.json()["detail"] for part in error["loc"]}


def test_two_step_times_of_1e308_are_refused_and_name_the_field(launched):
    run = launched()
    response = _post_points(run, [_point(1, step_s=1e308), _point(2, step_s=1e308)])
    assert response.status_code == 422 and "step_s" in _named(response)
    assert not MetricPoint.objects.exists()


@pytest.mark.parametrize("field", NUMBERS, ids=lambda f: f.name)
def test_every_number_has_a_largest_value(launched, field):
    assert field.maximum is not None and field.maximum <= 1e39
    run = launched()
    response = _post_points(run, [_point(1, **{field.name: field.kind(field.maximum) * 10})])
    assert response.status_code == 422 and field.name in _named(response)
    if field.minimum is not None and field.minimum < 0:
        response = _post_points(run, [_point(1, **{field.name: field.kind(field.minimum) * 10})])
        assert response.status_code == 422 and field.name in _named(response)
    assert not MetricPoint.objects.exists()


def test_what_a_run_reports_however_far_it_diverges_is_still_taken(launched):
    float32_max = 3.4028234663852886e38
    diverged = {f.name: float32_max for f in NUMBERS if f.maximum == metric_fields.LARGEST_NORM}
    run = launched()
    assert _post_points(run, [_point(1, **diverged), _point(2, step_s=3 * 3600.0, tokens_per_s=2e6)]).status_code \
        == 200
    assert MetricPoint.objects.count() == 2


@pytest.fixture
def logged_in(client, operator):
    client.force_login(operator)  # the seeded runs are no one's: an operator's to see
    return client


def huge_step_times():
    run = seed_run("huge-steps", state="training")
    MetricPoint.objects.filter(run=run, phase=2, step__in=[29, 30]).update(step_s=1e308)
    return run


def huge_everything():
    run = seed_run("huge-all", state="training")
    huge = {f.name: 1e308 for f in NUMBERS if f.kind is float}
    MetricPoint.objects.filter(run=run, phase=2, step__in=[29, 30]).update(**{**huge, "loss": -1e308})
    MetricPoint.objects.filter(run=run, phase=1, step__in=[5, 6]).update(**huge)
    return run


@pytest.mark.parametrize("seed", [huge_step_times, huge_everything])
def test_points_stored_before_the_bounds_leave_the_pages_working(logged_in, seed):
    run = seed()
    listed = logged_in.get(reverse("runs"))
    page = logged_in.get(reverse("run_detail", args=[run.pk]))
    charts = logged_in.get(reverse("run_chart_data", args=[run.pk]))
    compared = logged_in.get(reverse("run_compare"))
    assert (listed.status_code, page.status_code, charts.status_code, compared.status_code) == (200,) * 4
    assert "NaN" not in charts.content.decode() and "Infinity" not in charts.content.decode()
    assert MetricPoint.objects.filter(run=run, step_s=1e308).count() >= 2  # nothing stored is lost
