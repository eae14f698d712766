"""When the trainer ends on its own error (a recipe it refuses, a guard), the run's failure event says that error, not
the libraries' warnings its log holds before it; a crash keeps the whole tail, its traceback."""

import pytest

from training import guards, train
from training.trainer_exits import GUARD_EXIT, RECIPE_ERROR_EXIT, own_words

WARNINGS = "".join(f"/site-packages/lib.py:{n}: FutureWarning: something is deprecated\n" for n in range(40))


def _ended(monkeypatch, capsys, raised, tmp_path):
    def run(recipe, out=print):
        raise raised

    monkeypatch.setattr(train, "run", run)
    monkeypatch.setattr(train, "load_recipe", lambda path: {})
    monkeypatch.setattr(train.signal, "signal", lambda *args: None)  # not this test process's SIGTERM
    code = train.main(["--recipe", str(tmp_path / "recipe.yaml")])
    return code, WARNINGS + capsys.readouterr().err


@pytest.mark.parametrize(("raised", "exit_code", "said"), [
    (guards.GuardError("routed LoRA B got no gradient at step 1"), GUARD_EXIT,
     "ABORTED by a guard: routed LoRA B got no gradient at step 1"),
    (train.RecipeError("lora.r: 1024 is over 512"), RECIPE_ERROR_EXIT, "recipe error: lora.r: 1024 is over 512"),
])
def test_the_trainers_own_error_is_what_the_failure_says(monkeypatch, capsys, tmp_path, raised, exit_code, said):
    code, tail = _ended(monkeypatch, capsys, raised, tmp_path)
    assert code == exit_code
    assert own_words(code, tail) == said


def test_a_crash_keeps_its_whole_tail():
    tail = WARNINGS + "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error: an illegal memory access\n"
    assert own_words(1, tail) == tail
    # the words of an error line alone do not make a crash one: only the trainer's own exit codes are read for them
    assert own_words(1, tail + "ABORTED by a guard: quoted in a traceback\n").startswith(WARNINGS)
