"""Which of a run's checkpoints its store keeps: the recipe's `checkpoint.keep` newest complete ones, every phase's
final one, and nothing older than the newest never finished or refused. Pure (docs/runs.md, "runs/retention.py")."""

from typing import NamedTuple


class Stored(NamedTuple):
    phase: int
    step: int
    complete: bool
    refused: bool = False


def to_prune(stored: list[Stored], *, keep: int, finals: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """(phase, step) of every checkpoint to delete, oldest first."""
    usable = sorted(((c.phase, c.step) for c in stored if c.complete and not c.refused), reverse=True)
    if not usable:
        return []
    newest = usable[0]
    complete = {(c.phase, c.step) for c in stored if c.complete}
    kept = set(usable[:max(1, keep)]) | (finals & complete)
    drop = {(c.phase, c.step) for c in stored if (c.phase, c.step) not in kept and (c.phase, c.step) < newest}
    return sorted(drop)
