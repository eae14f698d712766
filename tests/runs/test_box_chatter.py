"""What a box that talks without end can add to its run's history: bounded log lines, one resume line."""

import json

import pytest
from django.test import Client

from tests.runs.conftest import put_on_a_box, stored_checkpoint

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


def test_a_box_logging_without_end_adds_a_bounded_number_of_lines(launched, settings):
    settings.AGENT_MAX_LOG_EVENTS_PER_HOUR = 5
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    for i in range(20):
        answer = client.post(API + "/events", json.dumps({"kind": "log", "message": f"line {i}"}),
                             content_type="application/json")
        assert answer.status_code == 200
    logs = list(run.events.filter(kind="log").order_by("id").values_list("message", flat=True))
    assert logs[:5] == [f"line {i}" for i in range(5)] and len(logs) == 6
    assert "More than 5 log lines" in logs[5]


def test_a_box_asking_for_its_spec_in_a_loop_is_said_to_resume_once(launched):
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    client.post(API + "/checkpoints", json.dumps(stored_checkpoint(run, 0, 2)), content_type="application/json")
    for _ in range(10):
        assert client.get(API + "/spec").status_code == 200
    assert run.events.filter(kind="resume").count() == 1
