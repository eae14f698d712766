"""A box posts only steps its run's recipe trains: a point at a phase the recipe lacks, or past its phase's steps, is
refused with the whole batch, so a box cannot grow the database a row per made-up step."""

import json

import pytest
from django.test import Client

from runs import reports
from runs.models import MetricPoint
from tests.runs.conftest import put_on_a_box

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


def _point(phase, step):
    return {"phase": phase, "step": step, "loss": 2.0, "step_s": 0.5}


def _post_points(run, points):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    return client.post(API + "/metrics", json.dumps({"points": points}), content_type="application/json")


@pytest.mark.parametrize("bad", [_point(100, 1), _point(5, 1), _point(0, 5), _point(0, 10_000_000), _point(4, 4)])
def test_a_step_outside_the_recipe_is_refused_with_its_batch(launched, bad):
    run = launched()  # phases 0 to 4: 4, 4, 3, 3 and 3 steps
    response = _post_points(run, [_point(0, 1), bad])
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert isinstance(detail, str) and f"phase {bad['phase']} step {bad['step']}" in detail
    assert not MetricPoint.objects.exists()
    run.refresh_from_db()
    assert (run.current_phase, run.current_step, run.last_step_at) == (0, 0, None)


def test_a_flood_of_made_up_steps_stores_nothing(launched):
    run = launched()
    response = _post_points(run, [_point(100, step) for step in range(1, 2001)])
    assert response.status_code == 422 and not MetricPoint.objects.exists()


def test_every_step_the_recipe_trains_is_taken(launched):
    run = launched()
    points = [_point(phase, step) for phase, steps in enumerate([4, 4, 3, 3, 3]) for step in range(steps + 1)]
    response = _post_points(run, points)
    assert response.status_code == 200 and response.json() == {"stored": len(points)}
    assert MetricPoint.objects.filter(run=run).count() == len(points)


def test_the_rule_names_the_first_point_outside():
    steps = [4, 3]
    assert reports.outside_recipe([_point(0, 4), _point(1, 0)], steps) is None
    assert reports.outside_recipe([_point(1, 4)], steps) == "phase 1 step 4: the recipe trains phase 1 for 3 steps"
    assert reports.outside_recipe([_point(2, 1)], steps) == "phase 2 step 1: the recipe has phases 0 to 1"
    assert reports.outside_recipe([], []) is None
