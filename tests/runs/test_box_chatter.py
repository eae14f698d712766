"""What a box that talks without end can add to its run's history: bounded log lines, one resume line, each piece of
news that moves nothing once an hour and within the hour's budget, one refusal of the same checkpoint."""

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


def test_a_box_repeating_news_that_moves_nothing_adds_it_once_and_a_bounded_number_of_other_lines(launched, settings):
    settings.AGENT_MAX_LOG_EVENTS_PER_HOUR = 5
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")

    def say(kind, message):
        answer = client.post(API + "/events", json.dumps({"kind": kind, "message": message}),
                             content_type="application/json")
        assert answer.status_code == 200, answer.content

    say("agent_started", "the agent started")  # news that moves the run: recorded as ever
    for _ in range(30):
        say("probe_ok", "x" * 4000)
    assert run.events.filter(kind="probe_ok").count() == 1
    for i in range(30):
        say("probe_ok", f"served {i}")
    assert run.events.filter(kind="probe_ok").count() == 5
    assert run.events.filter(kind="agent_started").count() == 1


def test_a_checkpoint_declared_complete_again_and_again_is_refused_each_time_and_said_once(launched):
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    notice = {"phase": 0, "step": 2, "uri": stored_checkpoint(run, 0, 2)["uri"], "complete": True,
              "manifest": {"adapter_model.safetensors": {"size": 10, "sha256": "0" * 64}}}
    for _ in range(10):
        answer = client.post(API + "/checkpoints", json.dumps(notice), content_type="application/json")
        assert answer.status_code == 409
    assert run.events.filter(kind="checkpoint_refused").count() == 1
