"""A phase's `min_step_seconds`: a floor on each step's wall time for demos, checked by the recipe and slept by the
trainer between steps (a stop request ends the wait); the launch page's example paces its CPT phase with it."""

import pytest

from runs.launch import demo_recipe
from training import train
from training.recipe import RecipeError, RunRecipe, validate


def _recipe(**phase) -> dict:
    return {"model": {"config": {"model_type": "qwen3_moe"}},
            "phases": [{"kind": "cpt", "data": "x.jsonl", "steps": 3, **phase}]}


def test_it_reads_a_phases_pace_and_refuses_a_negative_one():
    assert RunRecipe.from_dict(validate(_recipe(), data_on_disk=False)).phases[0].min_step_seconds == 0
    paced = validate(_recipe(min_step_seconds=1.5), data_on_disk=False)
    assert RunRecipe.from_dict(paced).phases[0].min_step_seconds == 1.5
    with pytest.raises(RecipeError, match=r"min_step_seconds: must be a number >= 0"):
        validate(_recipe(min_step_seconds=-1), data_on_disk=False)


class _Stop:
    """The trainer's stop event, recording how long each wait was asked to last."""

    def __init__(self, set_after: int | None = None):
        self.waits: list[float] = []
        self.set_after = set_after

    def wait(self, timeout):
        self.waits.append(timeout)

    def is_set(self):
        return self.set_after is not None and len(self.waits) >= self.set_after


class _Phase:
    def __init__(self, steps, min_step_seconds):
        self.spec = RunRecipe.from_dict(validate(_recipe(steps=steps, min_step_seconds=min_step_seconds),
                                                 data_on_disk=False)).phases[0]
        self.step, self.saved = 0, []

    @property
    def done(self):
        return self.step >= self.spec.steps

    def train_step(self):
        self.step += 1
        return {"step": self.step}

    def log(self, record):
        pass

    def checkpoint_due(self):
        return self.done

    def save(self):
        self.saved.append(self.step)

    def finish(self):
        pass


def test_it_waits_out_the_rest_of_each_paced_step(monkeypatch):
    stop = _Stop()
    monkeypatch.setattr(train, "STOP", stop)
    train.run_phase(_Phase(steps=3, min_step_seconds=2.0))
    assert len(stop.waits) == 3 and all(1.0 < wait <= 2.0 for wait in stop.waits)


def test_an_unpaced_phase_never_waits_and_a_stop_still_saves(monkeypatch):
    stop = _Stop()
    monkeypatch.setattr(train, "STOP", stop)
    train.run_phase(_Phase(steps=2, min_step_seconds=0))
    assert all(wait <= 0 for wait in stop.waits)
    stopping = _Stop(set_after=1)
    monkeypatch.setattr(train, "STOP", stopping)
    phase = _Phase(steps=5, min_step_seconds=2.0)
    with pytest.raises(train.StopRequested):
        train.run_phase(phase)
    assert phase.saved == [1]


def test_the_launch_pages_example_trains_its_first_phase_for_a_minute_or_two():
    cpt = RunRecipe.from_dict(validate(demo_recipe(), data_on_disk=False)).phases[0]
    assert cpt.kind == "cpt" and 60 <= cpt.steps * cpt.min_step_seconds <= 120
    assert cpt.steps // cpt.checkpoint_every >= 4  # a kill lands between checkpoints, not before the first
