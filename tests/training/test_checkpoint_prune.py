"""A trainer's store keeps its newest checkpoints and every phase's final one: those hold the run's adapters."""

from training import checkpoint
from training.checkpoint_names import checkpoint_name


def _complete(root, name):
    (root / name).mkdir(parents=True)
    (root / name / "trainer.pt").write_text("x")
    (root / name / checkpoint.MARKER).write_text("done\n")


def test_it_keeps_the_newest_and_each_phases_final(tmp_path):
    store = checkpoint.LocalStore(tmp_path)
    phases = [{"steps": 4}, {"steps": 6}]
    for phase, step in [(0, 2), (0, 4), (1, 2), (1, 4), (1, 6)]:
        _complete(tmp_path, checkpoint_name(phase, step))
    checkpoint.prune(store, keep=1, protected=checkpoint.phase_finals(phases))
    assert sorted(store.names()) == sorted([checkpoint_name(0, 4), checkpoint_name(1, 6)])
    checkpoint.prune(store, keep=1)
    assert list(store.names()) == [checkpoint_name(1, 6)]
