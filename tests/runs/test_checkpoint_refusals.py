"""What a box's refusal of a checkpoint may touch: only what it was offered to resume from; a phase's final adapter
stays in the store whatever a box says, and its phase is trained again before anything past it is resumed from."""

import json
from pathlib import Path

import pytest
from django.test import Client

from runs import checkpoints
from tests.runs.conftest import put_on_a_box, stored_checkpoint

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


def _post(client, path, body):
    return client.post(API + path, json.dumps(body), content_type="application/json")


def _box(run):
    return Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")


def _folder(run, phase, step):
    return Path(run.bucket) / "runs" / str(run.pk) / f"ckpt-p{phase:02d}-s{step:08d}"


def _declare(client, run, phase, step):
    answer = _post(client, "/checkpoints", stored_checkpoint(run, phase, step))
    assert answer.status_code == 200, answer.content


def _resume(client):
    return [(c["phase"], c["step"]) for c in client.get(API + "/spec").json()["resume"]]


def test_a_box_cannot_refuse_a_checkpoint_it_was_not_offered(launched):
    run = launched()
    final = run.phases.get(index=0).steps
    first = _box(run)
    _declare(first, run, 0, final)
    for step in (1, 2, 3):
        _declare(first, run, 1, step)
    second = _box(run)
    assert (0, final) not in _resume(second)  # three newer ones are offered before it
    answer = _post(second, "/checkpoints/rejected", {"phase": 0, "step": final, "reason": "does not match"})
    assert answer.status_code == 200 and answer.json() == {"rejected": False}
    assert run.checkpoints.get(phase=0, step=final).rejected_reason == ""
    _declare(second, run, 1, 4)
    assert _folder(run, 0, final).is_dir()
    assert not run.events.filter(kind="checkpoint_rejected").exists()


def _phase_zero_finished(launched):
    """A run whose first box declared phase 0's last two steps, the last its final adapter: (run, box, final)."""
    run = launched()
    final = run.phases.get(index=0).steps
    first = _box(run)
    _declare(first, run, 0, final - 1)
    _declare(first, run, 0, final)
    return run, first, final


def test_a_refused_final_adapter_stays_stored_and_its_phase_is_trained_again(launched):
    run, first, final = _phase_zero_finished(launched)
    _declare(first, run, 1, 1)
    second = _box(run)
    assert _resume(second) == [(1, 1), (0, final), (0, final - 1)]
    answer = _post(second, "/checkpoints/rejected", {"phase": 0, "step": final, "reason": "does not match"})
    assert answer.json() == {"rejected": True}
    # The box then claims progress past the adapter it refused: the refused adapter is not deleted for it, and
    # no later box resumes past it.
    _declare(second, run, 1, 2)
    assert _folder(run, 0, final).is_dir()
    assert _resume(_box(run)) == [(0, final - 1)]
    assert [(c.phase, c.step) for c in checkpoints.resume_points(run)] == [(0, final - 1)]


def test_the_phase_trained_again_makes_its_later_checkpoints_resumable_again(launched):
    run, _, final = _phase_zero_finished(launched)
    second = _box(run)
    _post(second, "/checkpoints/rejected", {"phase": 0, "step": final, "reason": "does not match"})
    assert _resume(second) == [(0, final - 1)]
    _declare(second, run, 0, final)  # trained again from the one before it
    _declare(second, run, 1, 1)
    assert _resume(_box(run)) == [(1, 1), (0, final), (0, final - 1)]


@pytest.mark.parametrize("phase, step", [(99, 1), (0, 0), (0, 10_000_000)])
def test_a_notice_for_a_step_the_recipe_does_not_train_is_refused_and_records_nothing(launched, phase, step):
    run = launched()
    client = _box(run)
    answer = _post(client, "/checkpoints", {"phase": phase, "step": step, "complete": False,
                                            "uri": f"ckpt-p{phase:02d}-s{step:08d}"})
    assert answer.status_code == 409 and "the recipe has no step" in answer.json()["detail"]
    assert not run.checkpoints.exists()
