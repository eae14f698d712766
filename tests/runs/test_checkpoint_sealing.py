"""A box writes only into its own attempt's folder, for as long as its last grant lasts; the dashboard checks a
declared checkpoint there and seals it, copying the manifest's files into the run's folder, which no box's grant
reaches. So a replaced or ended box cannot change what a later box resumes from or what the run's outputs are, nor
make an honest box's checkpoint fail (a run's local bucket, through the agent API as a box uses it)."""

import hashlib
import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from fleet import enqueue
from runs import checkpoints, events, serving, storage
from runs.models import RunAttempt
from tests.runs.conftest import put_on_a_box
from training.agent import Api, restore

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"
FILES = {"adapter/adapter_model.safetensors": b"weights" * 50, "trainer.pt": b"optimizer" * 40}


def _post(client, path, body):
    return client.post(API + path, json.dumps(body), content_type="application/json")


class _Box:
    """A box as its agent talks to the dashboard: its token, and the upload grant its last heartbeat brought."""

    def __init__(self, run):
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
        self.grant = self.beat().json()["upload"]

    def beat(self):
        return _post(self.client, "/heartbeat", {"state": "training", "process_alive": True})

    def write(self, uri, files):
        """Writes files where the box's grant lets it (what training.agent.uploads does); returns their manifest."""
        for name, data in files.items():
            target = Path(self.grant["path"]) / uri / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}

    def declare(self, phase, step, files=FILES):
        uri = f"ckpt-p{phase:02d}-s{step:08d}"
        return _post(self.client, "/checkpoints", {"phase": phase, "step": step, "uri": uri, "complete": True,
                                                   "manifest": self.write(uri, files)})


def _inside(path, folder) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def _resumed(box, tmp_path):
    """What the real agent restores from the box's spec, into a fresh store: (candidate or None, rejections)."""
    posts = []

    class Recorder(Api):
        def __init__(self):
            pass

        def call(self, method, path, body=None):
            posts.append((path, body))
            return {}

    chosen = restore(Recorder(), box.client.get(API + "/spec").json()["resume"], tmp_path / "new-box")
    return chosen, posts


def test_a_replaced_box_cannot_overwrite_the_checkpoint_its_successor_resumes_from(launched, tmp_path):
    run = launched()
    old = _Box(run)
    assert old.declare(0, 2).status_code == 200
    new = _Box(run)
    assert old.beat().status_code == 401  # no fresh grant: the old box keeps only the one it had
    # With the grant it still holds, the old box rewrites the checkpoint's optimizer state where it may write.
    old.write("ckpt-p00-s00000002", {"trainer.pt": b"pickled-code" * 30})
    spec = new.client.get(API + "/spec").json()
    for candidate in spec["resume"]:
        assert not _inside(candidate["download"]["path"], old.grant["path"])
    chosen, rejections = _resumed(new, tmp_path)
    assert chosen is not None and chosen["step"] == 2 and rejections == []
    assert (tmp_path / "new-box" / "ckpt-p00-s00000002" / "trainer.pt").read_bytes() == FILES["trainer.pt"]


def test_objects_another_box_planted_do_not_make_an_honest_checkpoint_fail(launched, monkeypatch, tmp_path):
    monkeypatch.setattr(storage, "MAX_CHECKPOINT_OBJECTS", 5)
    run = launched()
    old = _Box(run)
    new = _Box(run)
    # The replaced box fills the next checkpoint's name with junk and a trainer.pt of its own, before the new box
    # uploads it: more objects than any checkpoint holds, and a file of the right name and size but other bytes.
    old.write("ckpt-p00-s00000004", {f"junk-{i}": b"x" for i in range(8)})
    old.write("ckpt-p00-s00000004", {"trainer.pt": b"OPTIMIZER" * 40})
    answer = new.declare(0, 4)
    assert answer.status_code == 200, answer.content
    sealed = Path(storage.download_grant(storage.location(run.bucket, run.pk), "ckpt-p00-s00000004", FILES, 60)
                  ["path"])
    assert sorted(p.relative_to(sealed).as_posix() for p in sealed.rglob("*") if p.is_file()) == \
        ["COMPLETE", "adapter/adapter_model.safetensors", "trainer.pt"]
    chosen, rejections = _resumed(new, tmp_path)
    assert chosen["step"] == 4 and rejections == []


def test_a_box_whose_run_ended_can_write_nowhere_the_runs_outputs_are_read(launched):
    run = launched()
    box = _Box(run)
    events.record(run, "rented", "A box was rented.")
    assert _post(box.client, "/events", {"kind": "probe_ok"}).json()["state"] == "training"
    for phase in run.phases.all():
        assert box.declare(phase.index, phase.steps).status_code == 200
    assert _post(box.client, "/events", {"kind": "finished", "message": "done"}).json()["state"] == "finished"
    assert box.beat().status_code == 401
    where = storage.location(run.bucket, run.pk)
    for row in run.checkpoints.all():
        box.write(row.uri, {"trainer.pt": b"late" * 90, "adapter/adapter_model.safetensors": b"late" * 88})
        assert not _inside(serving.adapter_folder(run, row), box.grant["path"])
        sealed = Path(storage.download_grant(where, row.uri, row.manifest, 60)["path"])
        assert (sealed / "trainer.pt").read_bytes() == FILES["trainer.pt"]
    assert checkpoints.missing_outputs(run) == []


def test_a_checkpoint_changed_between_its_check_and_its_seal_is_refused_and_never_offered(launched, monkeypatch):
    monkeypatch.setattr(checkpoints, "SEAL_INLINE_BYTES", 0)  # sealed by a task, as a large checkpoint is
    run = launched()
    box = _Box(run)
    assert box.declare(0, 2).status_code == 200
    assert box.client.get(API + "/spec").json()["resume"] == []  # not sealed yet: never offered
    box.write("ckpt-p00-s00000002", {"trainer.pt": b"OPTIMIZER" * 40})  # same size, other bytes
    row = run.checkpoints.get(step=2)
    assert checkpoints.seal(row.pk) is False
    row.refresh_from_db()
    assert row.sealed_at is None and row.rejected_reason.startswith("not sealed: trainer.pt changed")
    assert "could not be sealed" in run.events.get(kind="checkpoint_refused").message
    assert box.client.get(API + "/spec").json()["resume"] == []


def test_a_box_finishing_before_its_final_checkpoint_is_sealed_is_told_to_say_it_again(launched, monkeypatch):
    monkeypatch.setattr(checkpoints, "SEAL_INLINE_BYTES", 0)
    run = launched()
    box = _Box(run)
    events.record(run, "rented", "A box was rented.")
    _post(box.client, "/events", {"kind": "probe_ok"})
    for phase in run.phases.all():
        assert box.declare(phase.index, phase.steps).status_code == 200
    answer = _post(box.client, "/events", {"kind": "finished", "message": "done"})
    assert answer.status_code == 503 and answer["Retry-After"] and "still being sealed" in answer.json()["detail"]
    run.refresh_from_db()
    assert run.state == "training" and not run.events.filter(kind="outputs_lost").exists()
    for row in run.checkpoints.all():
        assert checkpoints.seal(row.pk) is True
    assert _post(box.client, "/events", {"kind": "finished", "message": "done"}).json()["state"] == "finished"


def test_the_supervisor_queues_a_lost_seal_again_and_empties_folders_whose_grants_expired(launched, monkeypatch,
                                                                                          settings):
    monkeypatch.setattr(checkpoints, "SEAL_INLINE_BYTES", 0)
    queued = []
    monkeypatch.setattr(enqueue, "seal_checkpoint", queued.append)  # the task's message is lost on the way
    run = launched()
    old = _Box(run)
    assert old.declare(0, 2).status_code == 200
    new = _Box(run)
    now = timezone.now()
    checkpoints.tend_store(run, now)
    assert queued == []  # just declared: its own task is on the way
    row = run.checkpoints.get(step=2)
    checkpoints.tend_store(run, now + timedelta(seconds=checkpoints.RESEAL_AFTER_S + 1))
    assert queued == [row.pk]
    # The old attempt's folder is kept while its upload waits to be sealed, and while its grant may still be used.
    old.write("junk", {"left-over": b"x"})
    later = now + timedelta(seconds=settings.STORAGE_UPLOAD_GRANT_S + 1)
    checkpoints.tend_store(run, later)
    assert Path(old.grant["path"], "junk").exists()
    assert checkpoints.seal(row.pk) is True
    checkpoints.tend_store(run, later)
    assert not Path(old.grant["path"]).exists()
    assert RunAttempt.objects.get(pk=run.attempts.first().pk).uploads_deleted_at == later
    assert Path(new.grant["path"]).parent.is_dir()  # the current box's is never touched


@pytest.mark.django_db(transaction=True)
def test_a_large_checkpoint_is_sealed_by_the_worker_and_offered_only_then(launched, monkeypatch, celery_worker):
    monkeypatch.setattr(checkpoints, "SEAL_INLINE_BYTES", 0)  # as a checkpoint of many GB: no request copies it
    run = launched()
    box = _Box(run)
    assert box.declare(0, 2).status_code == 200
    row = run.checkpoints.get(step=2)
    deadline = time.monotonic() + 30
    while row.sealed_at is None and time.monotonic() < deadline:
        time.sleep(0.2)
        row.refresh_from_db()
    assert row.sealed_at is not None and row.rejected_reason == ""
    assert [c["step"] for c in box.client.get(API + "/spec").json()["resume"]] == [2]
