"""The agent API as a box uses it: its token opens its own attempt of its own run only, and bad input changes
nothing."""

import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from fleet.reaper import sweep
from runs import events, tokens
from runs.models import Checkpoint, MetricPoint
from tests.runs.conftest import put_on_a_box

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


def _client(run, token=None):
    return Client(HTTP_AUTHORIZATION=f"Bearer {token or put_on_a_box(run)}")


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
    assert spec["resume"] == [] and spec["upload"]["kind"] == "local"
    assert spec["upload"]["path"].endswith(f"runs/{run.pk}/attempts/{run.attempts.get().pk}")


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
    token = put_on_a_box(run)
    run.token_nonce = tokens.new_nonce()
    run.save()
    assert _client(run, token).get(API + "/spec").status_code == 401
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


def _stored(run, uri, files):
    """Writes a checkpoint's files where the run's current box uploads them (its attempt's folder); returns its
    manifest."""
    import hashlib
    from pathlib import Path

    attempt = run.attempts.get(ended_at=None)
    root = Path(run.bucket) / "runs" / str(run.pk) / "attempts" / str(attempt.pk) / uri
    manifest = {}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        manifest[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return manifest


FILES = {"adapter/adapter_model.safetensors": b"w" * 64, "trainer.pt": b"t" * 32}


def _declare(client, step, uri, manifest):
    return _post(client, "/checkpoints", {"phase": 0, "step": step, "uri": uri, "complete": True,
                                          "manifest": manifest})


def test_it_records_checkpoints_inside_the_run_only(launched):
    run = launched()
    client = _client(run)
    assert _post(client, "/checkpoints", {"phase": 0, "step": 4, "uri": "ckpt-p00-s00000004",
                                          "complete": False}).status_code == 200
    for uri in ["../other-run/p0", "/etc/passwd", "a/../../b", "p0 s4", ".", "ckpt-p00-s00000004",
                "ckpt-p00-s00000005/.."]:
        assert _declare(client, 5, uri, {}).status_code == 422  # only its own folder, ckpt-p00-s00000005
    assert _declare(client, 4, "ckpt-p00-s00000004", _stored(run, "ckpt-p00-s00000004", FILES)).status_code == 200
    checkpoint = Checkpoint.objects.get()
    assert (checkpoint.uri, checkpoint.complete, checkpoint.size_bytes) == ("ckpt-p00-s00000004", True, 96)
    resume = client.get(API + "/spec").json()["resume"]
    assert [c["step"] for c in resume] == [4] and set(resume[0]["manifest"]) == set(FILES)


def test_it_never_resumes_from_a_half_written_checkpoint(launched):
    run = launched()
    client = _client(run)
    _declare(client, 2, "ckpt-p00-s00000002", _stored(run, "ckpt-p00-s00000002", FILES))
    _post(client, "/checkpoints", {"phase": 0, "step": 4, "uri": "ckpt-p00-s00000004", "complete": False})
    assert [c["uri"] for c in client.get(API + "/spec").json()["resume"]] == ["ckpt-p00-s00000002"]


def test_it_declares_complete_only_what_the_store_holds(launched):
    run = launched()
    client = _client(run)
    manifest = _stored(run, "ckpt-p00-s00000004", FILES)
    lying = {**manifest, "trainer.pt": {**manifest["trainer.pt"], "size": 33}}
    missing = {**manifest, "extra.bin": {"size": 1, "sha256": "0" * 64}}
    for bad in (None, {}, lying, missing, {"../x": manifest["trainer.pt"]},
                {"COMPLETE": manifest["trainer.pt"]}, {"a": {"size": -1, "sha256": "0" * 64}},
                {"a": {"size": 1, "sha256": "not-hex"}}):
        response = _declare(client, 4, "ckpt-p00-s00000004", bad)
        assert response.status_code in (409, 422), bad
        assert "detail" in response.json()
    assert not run.checkpoints.filter(complete=True).exists() and client.get(API + "/spec").json()["resume"] == []
    assert run.events.filter(kind="checkpoint_refused").exists()


def test_it_never_reopens_or_rewrites_a_complete_checkpoint(launched):
    run = launched()
    client = _client(run)
    manifest = _stored(run, "ckpt-p00-s00000004", FILES)
    assert _declare(client, 4, "ckpt-p00-s00000004", manifest).status_code == 200
    assert _declare(client, 4, "ckpt-p00-s00000004", manifest).status_code == 200  # a retried post
    other = _stored(run, "ckpt-p00-s00000004", {**FILES, "trainer.pt": b"x" * 32})
    assert _declare(client, 4, "ckpt-p00-s00000004", other).status_code == 409
    assert _post(client, "/checkpoints", {"phase": 0, "step": 4, "uri": "ckpt-p00-s00000004",
                                          "complete": False}).status_code == 409
    assert Checkpoint.objects.get().manifest == manifest


def test_a_checkpoint_a_box_refused_is_never_offered_again(launched):
    run = launched()
    client = _client(run)
    _declare(client, 2, "ckpt-p00-s00000002", _stored(run, "ckpt-p00-s00000002", FILES))
    _declare(client, 4, "ckpt-p00-s00000004", _stored(run, "ckpt-p00-s00000004", FILES))
    answer = _post(client, "/checkpoints/rejected", {"phase": 0, "step": 4, "reason": "trainer.pt does not match"})
    assert answer.json() == {"rejected": True}
    assert [c["step"] for c in client.get(API + "/spec").json()["resume"]] == [2]
    assert "trainer.pt does not match" in run.events.get(kind="checkpoint_rejected").message


def test_a_step_trained_again_after_its_checkpoint_was_refused_is_recorded_in_its_place(launched):
    # The box that resumed from step 2 trains step 4 again and uploads it: without this, a refused final step
    # would leave the run without its adapter for good.
    run = launched()
    client = _client(run)
    _declare(client, 2, "ckpt-p00-s00000002", _stored(run, "ckpt-p00-s00000002", FILES))
    _declare(client, 4, "ckpt-p00-s00000004", _stored(run, "ckpt-p00-s00000004", FILES))
    _post(client, "/checkpoints/rejected", {"phase": 0, "step": 4, "reason": "trainer.pt does not match"})
    assert _post(client, "/checkpoints", {"phase": 0, "step": 4, "uri": "ckpt-p00-s00000004",
                                          "complete": False}).status_code == 200
    again = _stored(run, "ckpt-p00-s00000004", {**FILES, "trainer.pt": b"u" * 40})
    assert _declare(client, 4, "ckpt-p00-s00000004", again).status_code == 200
    row = run.checkpoints.get(step=4)
    assert row.complete and row.rejected_reason == "" and row.manifest == again
    assert [c["step"] for c in client.get(API + "/spec").json()["resume"]] == [4, 2]
    assert _declare(client, 4, "ckpt-p00-s00000004", _stored(run, "ckpt-p00-s00000004", FILES)).status_code == 409


def test_a_replaced_or_ended_attempt_is_refused_and_touches_nothing(launched):
    run = launched()
    stale_token = put_on_a_box(run)
    stale_box = run.current_instance
    current = _client(run)  # the run moved to a new box
    stale = _client(run, stale_token)
    assert _post(stale, "/heartbeat", {"state": "training", "process_alive": True, "gpu_util_percent": 90}
                 ).status_code == 401
    assert _post(stale, "/metrics", {"points": [_point(1)]}).status_code == 401
    assert _post(stale, "/events", {"kind": "finished"}).status_code == 401
    stale_box.refresh_from_db()
    assert stale_box.last_process_at is None and stale_box.gpu_util_percent is None and not run.metrics.exists()
    assert _post(current, "/heartbeat", {"state": "training", "process_alive": True}).status_code == 200
    events.record(run, "cancelled", "An operator cancelled it.")
    assert _post(current, "/heartbeat", {"state": "training"}).status_code == 401


@pytest.mark.parametrize("kind", ["finished", "trainer_failed"])
def test_a_report_from_a_box_replaced_while_it_was_on_the_way_moves_nothing(launched, kind):
    # Its token was good when the request came in; the supervisor moved the run to a new box before it was handled.
    from runs import reports

    run = launched()
    put_on_a_box(run)
    old = run.attempts.get()
    for step in ("rented", "agent_started", "probe_ok"):
        events.record(run, step, step)
    put_on_a_box(run)  # the run is on its next box now
    before = run.state
    assert before == "training"
    assert reports.agent_event(old, kind, "the old box's last words") == before
    run.refresh_from_db()
    assert run.state == before and run.events.filter(kind=kind).exists()  # kept as history
    old.instance.refresh_from_db()
    assert old.instance.keep_until is None


def test_a_token_expires_unless_heartbeats_renew_it(launched, settings):
    from datetime import timedelta

    from django.utils import timezone

    run = launched()
    then = timezone.now() - timedelta(seconds=settings.AGENT_DEAD_MAN_WINDOW_S + 60)
    token = put_on_a_box(run, now=then)
    assert _client(run, token).get(API + "/spec").status_code == 401
    fresh = put_on_a_box(run)
    assert _post(_client(run, fresh), "/heartbeat", {"state": "training"}).status_code == 200
    expires = run.attempts.get(ended_at=None).token_expires_at
    assert expires > timezone.now() + timedelta(seconds=settings.AGENT_DEAD_MAN_WINDOW_S - 60)


def test_it_tells_the_box_to_stop_its_machine_when_nothing_watches_it(launched, settings):
    from datetime import timedelta

    from django.utils import timezone

    from runs import pulse

    run = launched()
    client = _client(run, put_on_a_box(run, supervised=False))
    answer = _post(client, "/heartbeat", {"state": "training"}).json()
    assert answer["command"] == "stop_machine" and "supervisor never finished a pass" in answer["reason"]
    pulse.record("supervisor", timezone.now() - timedelta(seconds=settings.SUPERVISOR_STALE_S + 5))
    assert _post(client, "/heartbeat", {"state": "training"}).json()["command"] == "stop_machine"
    pulse.record("supervisor", timezone.now())
    assert _post(client, "/heartbeat", {"state": "training"}).json()["command"] == "continue"
    assert run.events.filter(kind="told_to_stop").count() == 1


def test_it_tells_the_box_to_stop_its_machine_when_the_budget_is_spent(launched):
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from fleet.models import CostSegment

    run = launched(budget=Decimal("2"))
    client = _client(run)
    CostSegment.objects.create(instance=run.current_instance, usd_per_hour=Decimal("1.00"),
                               started_at=timezone.now() - timedelta(hours=3))
    answer = _post(client, "/heartbeat", {"state": "training"}).json()
    assert answer["command"] == "stop_machine" and "budget" in answer["reason"]


def test_it_moves_the_run_on_agent_events_and_renews_on_heartbeats(launched):
    run = launched()
    client = _client(run)
    assert _post(client, "/events", {"kind": "exploded"}).status_code == 422
    beat = _post(client, "/heartbeat", {"state": "installing", "process_alive": False})
    assert beat.status_code == 200 and beat.json()["command"] == "continue"
    run.refresh_from_db()
    assert run.credentials_renewed_at is not None
    assert _post(client, "/events", {"kind": "log", "message": "pip done"}).json()["state"] == "pending"
    events.record(run, "rented", "A box was rented.")  # the supervisor's record of the rent
    _post(client, "/heartbeat", {"state": "installing", "process_alive": True})
    run.refresh_from_db()
    assert run.state == "installing"  # the agent's first heartbeat on its box
    assert _post(client, "/events", {"kind": "probe_ok"}).json()["state"] == "training"
    assert _post(client, "/heartbeat", {"state": "uploading", "gpu_util_percent": 101}).status_code == 422


def test_it_serves_its_openapi_schema_to_boxes_only(client, launched):
    schema = _client(launched()).get(API + "/openapi.json").json()
    assert {"/api/agent/v1/spec", "/api/agent/v1/metrics", "/api/agent/v1/heartbeat"} <= set(schema["paths"])
    assert client.get(API + "/openapi.json").status_code == 401  # anyone else: not even the API's shape
    assert Client(HTTP_AUTHORIZATION="Bearer run_forged").get(API + "/openapi.json").status_code == 401


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
    assert _post(client, "/checkpoints", {"phase": 0, "step": 1, "uri": "ckpt-p00-s00000001", "complete": True,
                                          "manifest": {"a": {"size": 10**20, "sha256": "0" * 64}}}).status_code == 409
    assert not run.events.filter(kind="log").exists() and not run.checkpoints.exists()


def test_it_keeps_the_later_of_a_step_sent_twice_in_one_batch(launched):
    run = launched()
    response = _post(_client(run), "/metrics", {"points": [_point(1, loss=3.0), _point(1, loss=2.0)]})
    assert response.status_code == 200
    assert list(run.metrics.values_list("step", "loss")) == [(1, 2.0)]


def test_an_agent_still_installing_keeps_its_box_off_the_reapers_idle_rule(launched):
    """Its probe, the checkpoint restore and a 67 GB model download come before the trainer: heartbeats then say
    the box is at work, and the idle rule (nothing running 30 min after start) must not take it."""
    run = launched()
    token = put_on_a_box(run)
    box = run.current_instance
    box.__class__.objects.filter(pk=box.pk).update(running_at=timezone.now() - timedelta(minutes=36))
    assert _post(_client(run, token), "/heartbeat", {"state": "installing", "gpu_ok": True}).status_code == 200
    box.refresh_from_db()
    assert box.last_process_at is not None
    assert [d for d in sweep.reap(dry_run=True).decisions if d.pk == box.pk] == []


def test_a_run_finished_without_its_adapters_keeps_its_box_then_lets_it_go(launched):
    """The box's disk may be the only copy: kept for RUN_KEEP_BOX_ON_LOST_OUTPUTS_H, and marked done with, so that
    the sync destroys it when the keep expires (not the 12 h age rule, billing all the while)."""
    run = launched()
    token = put_on_a_box(run)
    type(run).objects.filter(pk=run.pk).update(state="training")  # it trained, and its checkpoints never landed
    assert _post(_client(run, token), "/events", {"kind": "finished"}).status_code == 200
    run.refresh_from_db()
    box = run.current_instance
    box.refresh_from_db()
    assert run.events.filter(kind="outputs_lost").exists()
    assert box.keep_until is not None and box.state == "running"
    kept_h = (box.keep_until - run.events.get(kind="outputs_lost").at).total_seconds() / 3600
    assert round(kept_h, 3) == min(settings.RUN_KEEP_BOX_ON_LOST_OUTPUTS_H, settings.MAX_KEEP_FOR_DEBUG_HOURS)
    assert "finished with its outputs missing" in box.failure_reason  # what the sync's keep-expiry destroy reads
