"""The agent API as a box uses it: its token opens its own run only, and bad input changes nothing."""

import json

import pytest
from django.test import Client

from runs import events, tokens
from runs.models import Checkpoint, MetricPoint

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


def _client(run):
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.issue(run)}")


def _post(client, path, body):
    return client.post(API + path, json.dumps(body), content_type="application/json")


def _point(step, **fields):
    return {"phase": 0, "step": step, "loss": 2.5 - step * 0.1, "lr": 1e-3, "step_s": 0.5, "tokens_per_s": 512.0,
            "grad_norm_routed": 0.3, "grad_norm_attention": 0.2, "grad_norm_total": 0.36, "routed_b_norm": 0.01,
            "routed_b_zero": 0, "gpu_mem_gib": 1.5, "kernel_path": "loop", **fields}


def test_it_gives_the_box_its_spec(launched):
    run = launched()
    spec = _client(run).get(API + "/spec").json()
    assert spec["run_id"] == run.pk and [p["kind"] for p in spec["phases"]] == ["cpt", "sft", "dpo", "kto", "grpo"]
    assert spec["resume"] is None and spec["upload"]["kind"] == "local"
    assert spec["upload"]["path"].endswith(f"runs/{run.pk}")


def test_it_opens_only_the_tokens_own_run(launched):
    mine, theirs = launched("mine"), launched("theirs")
    client = _client(mine)
    assert _post(client, "/metrics", {"points": [_point(1)]}).status_code == 200
    assert mine.metrics.count() == 1 and theirs.metrics.count() == 0
    assert client.get(API + "/spec").json()["run_id"] == mine.pk  # no way to name another run


@pytest.mark.parametrize("header", ["", "Bearer nope", "Bearer run_1.abc:forged", "Basic dXNlcjpwYXNz"])
def test_it_refuses_a_missing_or_forged_token(launched, header):
    run = launched()
    client = Client(HTTP_AUTHORIZATION=header) if header else Client()
    assert client.get(API + "/spec").status_code == 401
    assert _post(client, "/metrics", {"points": [_point(1)]}).status_code == 401
    assert not run.metrics.exists()


def test_it_revokes_tokens_with_a_new_nonce(launched):
    run = launched()
    old = _client(run)
    run.token_nonce = tokens.new_nonce()
    run.save()
    assert old.get(API + "/spec").status_code == 401
    assert _client(run).get(API + "/spec").status_code == 200


def test_it_rejects_bad_points_and_stores_none_of_the_batch(launched):
    run = launched()
    client = _client(run)
    for bad in [_point(2, loss="NaN"), _point(-1), _point(2, grad_norm_routed=-1.0), {"step": 2},
                _point(2, kernel_path="x" * 50)]:
        response = _post(client, "/metrics", {"points": [_point(1), bad]})
        assert response.status_code == 422, bad
        assert "detail" in response.json()
    assert not MetricPoint.objects.exists()
    assert client.post(API + "/metrics", "{not json", content_type="application/json").status_code == 400


def test_it_limits_the_size_of_a_batch(launched, settings):
    settings.AGENT_MAX_METRIC_POINTS = 10
    run = launched()
    response = _post(_client(run), "/metrics", {"points": [_point(i) for i in range(11)]})
    assert response.status_code == 413 and not run.metrics.exists()
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = _post(_client(run), "/metrics", {"points": [_point(i) for i in range(10)]})
    assert response.status_code == 413


def test_it_replaces_a_step_trained_again_after_a_resume(launched):
    run = launched()
    client = _client(run)
    _post(client, "/metrics", {"points": [_point(1), _point(2)]})
    _post(client, "/metrics", {"points": [_point(2, loss=9.0), _point(3)]})
    assert list(run.metrics.order_by("step").values_list("step", "loss")) == [(1, 2.4), (2, 9.0), (3, 2.2)]
    run.refresh_from_db()
    assert (run.current_phase, run.current_step) == (0, 3)


def test_it_records_checkpoints_inside_the_run_only(launched):
    run = launched()
    client = _client(run)
    assert _post(client, "/checkpoints", {"phase": 0, "step": 4, "uri": "p0-s4", "complete": False}).status_code == 200
    for uri in ["../other-run/p0", "/etc/passwd", "a/../../b", "p0 s4"]:
        assert _post(client, "/checkpoints", {"phase": 0, "step": 5, "uri": uri, "complete": True}).status_code == 422
    _post(client, "/checkpoints", {"phase": 0, "step": 4, "uri": "p0-s4", "complete": True})
    assert list(Checkpoint.objects.values_list("uri", "complete")) == [("p0-s4", True)]
    assert client.get(API + "/spec").json()["resume"]["step"] == 4


def test_it_never_resumes_from_a_half_written_checkpoint(launched):
    run = launched()
    client = _client(run)
    _post(client, "/checkpoints", {"phase": 0, "step": 2, "uri": "p0-s2", "complete": True})
    _post(client, "/checkpoints", {"phase": 0, "step": 4, "uri": "p0-s4", "complete": False})
    assert client.get(API + "/spec").json()["resume"]["uri"] == "p0-s2"


def test_it_moves_the_run_on_agent_events_and_renews_on_heartbeats(launched):
    run = launched()
    client = _client(run)
    assert _post(client, "/events", {"kind": "exploded"}).status_code == 422
    beat = _post(client, "/heartbeat", {"state": "installing", "process_alive": False})
    assert beat.status_code == 200 and beat.json()["command"] == "continue"
    run.refresh_from_db()
    assert run.credentials_renewed_at is not None
    assert _post(client, "/events", {"kind": "log", "message": "pip done"}).json()["state"] == "pending"
    events.record(run, "rented", "A box was rented.")
    _post(client, "/heartbeat", {"state": "installing", "process_alive": True})
    run.refresh_from_db()
    assert run.state == "installing"  # the agent's first heartbeat on its box
    assert _post(client, "/events", {"kind": "probe_ok"}).json()["state"] == "training"
    assert _post(client, "/heartbeat", {"state": "uploading", "gpu_util_percent": 101}).status_code == 422


def test_it_serves_its_openapi_schema(client):
    schema = client.get(API + "/openapi.json").json()
    assert {"/api/agent/v1/spec", "/api/agent/v1/metrics", "/api/agent/v1/heartbeat"} <= set(schema["paths"])


def test_it_stores_step_times_in_utc_and_refuses_impossible_ones(launched):
    run = launched()
    client = _client(run)
    assert _post(client, "/metrics", {"points": [_point(1, at="5018-12-04T10:09:51+18:28")]}).status_code == 422
    assert _post(client, "/metrics", {"points": [_point(1, at="0001-01-01T00:00:00+05:00")]}).status_code == 422
    assert _post(client, "/metrics", {"points": [_point(1, at="2026-11-29T12:00:00+05:00")]}).status_code == 200
    assert run.metrics.get().at.isoformat() == "2026-11-29T07:00:00+00:00"


def test_it_refuses_what_the_database_cannot_hold(launched):
    run = launched()
    client = _client(run)
    assert _post(client, "/events", {"kind": "log", "message": "bad\x00byte"}).status_code == 422
    assert _post(client, "/checkpoints", {"phase": 0, "step": 1, "uri": "c", "complete": True,
                                          "size_bytes": 10**20}).status_code == 422
    assert not run.events.filter(kind="log").exists() and not run.checkpoints.exists()


def test_it_keeps_the_later_of_a_step_sent_twice_in_one_batch(launched):
    run = launched()
    response = _post(_client(run), "/metrics", {"points": [_point(1, loss=3.0), _point(1, loss=2.0)]})
    assert response.status_code == 200
    assert list(run.metrics.values_list("step", "loss")) == [(1, 2.0)]
