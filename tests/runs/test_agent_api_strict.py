"""The agent API takes numbers and booleans as what they are (a `true` is no step number, nor "7" or 7.0), and
bodies as JSON only: a text, form or multipart body is answered 415, while the agent's own posts go through."""

import json
import time
from contextlib import contextmanager

import httpx
import pytest
from django.core import signals
from django.db import close_old_connections
from django.test import Client

from config.wsgi import application
from runs.models import Checkpoint, MetricPoint
from tests.runs.conftest import put_on_a_box
from training.agent.dashboard import Api
from training.agent.metrics import to_point

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


def _point(step=1, **fields):
    return {"phase": 0, "step": step, "loss": 2.5, "lr": 1e-3, "step_s": 0.5, "tokens_per_s": 512.0,
            "routed_b_zero": 0, "kernel_path": "loop", **fields}


def _post(client, path, body):
    return client.post(API + path, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("bad", [{"step": True}, {"step": "7"}, {"step": 7.0}, {"phase": True}, {"phase": "0"},
                                 {"routed_b_zero": True}, {"routed_b_zero": 3.0}, {"routed_b_zero": "3"},
                                 {"loss": "2.5"}, {"step_s": True}])
def test_a_point_with_a_number_in_disguise_is_refused(launched, bad):
    run = launched()
    response = _post(Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}"), "/metrics",
                     {"points": [_point(**bad)]})
    assert response.status_code == 422
    assert next(iter(bad)) in {str(part) for error in response.json()["detail"] for part in error["loc"]}
    assert not MetricPoint.objects.exists()


def test_a_float_field_still_takes_a_whole_number(launched):
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    assert _post(client, "/metrics", {"points": [_point(loss=2, step_s=1, tokens_per_s=512)]}).status_code == 200
    assert MetricPoint.objects.get().step_s == 1.0


@pytest.mark.parametrize("path, body", [
    ("/heartbeat", {"state": "training", "step": True}),
    ("/heartbeat", {"state": "training", "phase": "1"}),
    ("/heartbeat", {"state": "training", "process_alive": 1}),
    ("/heartbeat", {"state": "training", "gpu_ok": "true"}),
    ("/heartbeat", {"state": "training", "upload_queue": 1.0}),
    ("/checkpoints", {"phase": True, "step": 4, "uri": "ckpt-p01-s00000004", "complete": False}),
    ("/checkpoints", {"phase": 0, "step": "4", "uri": "ckpt-p00-s00000004", "complete": False}),
    ("/checkpoints", {"phase": 0, "step": 4, "uri": "ckpt-p00-s00000004", "complete": 0}),
    ("/checkpoints/rejected", {"phase": 0, "step": True, "reason": "bad"}),
])
def test_the_other_reports_take_numbers_and_booleans_strictly(launched, path, body):
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    assert _post(client, path, body).status_code == 422
    run.current_instance.refresh_from_db()
    assert run.current_instance.last_process_at is None and not Checkpoint.objects.exists()


REPORTS = [("/heartbeat", {"state": "training", "process_alive": True}), ("/metrics", {"points": [_point()]}),
           ("/checkpoints", {"phase": 0, "step": 4, "uri": "ckpt-p00-s00000004", "complete": False}),
           ("/checkpoints/rejected", {"phase": 0, "step": 4, "reason": "bad"}),
           ("/events", {"kind": "log", "message": "hello"})]


@pytest.mark.parametrize("path, body", REPORTS, ids=[path for path, _ in REPORTS])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_a_body_that_is_not_declared_json_is_answered_415(launched, path, body, content_type):
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    if content_type == "multipart/form-data":
        response = client.post(API + path, {"payload": json.dumps(body)})  # the test client's multipart default
    elif content_type is None:
        response = client.generic("POST", API + path, json.dumps(body), content_type="")
    else:
        response = client.post(API + path, json.dumps(body), content_type=content_type)
    assert response.status_code == 415 and "application/json" in response.json()["detail"]
    run.current_instance.refresh_from_db()
    assert run.current_instance.last_process_at is None
    assert not MetricPoint.objects.exists() and not Checkpoint.objects.exists()
    assert not run.events.filter(kind="log").exists()
    assert _post(client, path, body).status_code == 200  # the same report as JSON


def test_json_with_its_charset_is_json(launched):
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    response = client.post(API + "/metrics", json.dumps({"points": [_point()]}),
                           content_type="Application/JSON; charset=utf-8")
    assert response.status_code == 200 and MetricPoint.objects.count() == 1


def test_without_a_token_it_is_still_401_whatever_the_body(launched):
    launched()
    for client in (Client(), Client(HTTP_AUTHORIZATION="Bearer run_forged")):
        assert client.post(API + "/metrics", json.dumps({"points": [_point()]}),
                           content_type="text/plain").status_code == 401


@contextmanager
def _wsgi_connections_kept():
    # Called straight through WSGI, each request would close the test's database connection at its end.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def test_the_agents_own_posts_are_taken(launched):
    run = launched()
    api = Api("http://testserver/api/agent/v1/", put_on_a_box(run), attempts=1)
    api.http = httpx.Client(base_url=api.http.base_url, headers=api.http.headers,
                            transport=httpx.WSGITransport(app=application))
    record = {"phase": 0, "step": 3, "time": time.time(), "loss": 2.0, "lr": 1e-4, "step_s": 0.7,
              "tokens_per_s": 900.0, "routed_b_zero": 4, "kernel_path": "triton"}
    with _wsgi_connections_kept():
        api.call("POST", "heartbeat", {"state": "training", "process_alive": True, "upload_queue": 0,
                                       "gpu_ok": True, "gpu_util_percent": 90.0})
        assert api.call("POST", "metrics", {"points": [to_point(record)]}) == {"stored": 1}
        api.call("POST", "events", {"kind": "log", "message": "from the agent"})
    assert MetricPoint.objects.get().routed_b_zero == 4 and run.events.filter(kind="log").exists()
