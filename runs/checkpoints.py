"""A run's checkpoints as the dashboard records them: declared by its box, verified against the store, offered for
resume newest first, pruned to the recipe's keep count, and checked for the run's final adapters when it finishes."""

import logging

from django.db import transaction
from django.utils import timezone

from runs import manifests, retention, storage
from runs.models import Checkpoint, Run, RunAttempt

log = logging.getLogger(__name__)


class CheckpointRefused(Exception):
    """A checkpoint notice the dashboard does not record (the agent API answers 409 with the reason)."""


def checkpoint(attempt: RunAttempt, notice: dict, *, now=None) -> Checkpoint:
    """Records a checkpoint the box began or finished uploading. Declared complete, it needs a manifest the store
    matches, and is never reopened unless a box refused it or it was pruned (docs/runs.md, "runs/checkpoints.py")."""
    now = now or timezone.now()
    run = attempt.run
    phase = run.phases.filter(index=notice["phase"]).first()
    if phase is None or not 0 < notice["step"] <= phase.steps:
        # Only a step the recipe trains can have a checkpoint: anything else is a row (and a prune) per post.
        raise CheckpointRefused(f"Checkpoint {notice['uri']}: the recipe has no step {notice['step']} in phase "
                                f"{notice['phase']}.")
    key = {"run": run, "phase": notice["phase"], "step": notice["step"]}
    values = {"uri": notice["uri"], "complete": False, "manifest": None, "size_bytes": None, "created_at": now,
              "rejected_reason": "", "pruned_at": None}
    if notice["complete"]:
        try:
            manifest = manifests.validated(notice.get("manifest"))
        except manifests.ManifestError as exc:
            raise CheckpointRefused(f"Checkpoint {notice['uri']}: {exc}.") from None
        try:
            stored = storage.stored_files(storage.location(run.bucket, run.pk), notice["uri"])
        except storage.TooManyObjects as exc:
            run.events.create(at=now, kind="checkpoint_refused", message=f"Checkpoint {notice['uri']}: {exc}."[:4000])
            raise CheckpointRefused(f"Checkpoint {notice['uri']}: {exc}.") from None
        problems = manifests.missing_from_store(manifest, stored)
        if problems:
            message = f"Checkpoint {notice['uri']} is not complete in the store: {'; '.join(problems[:5])}."
            run.events.create(at=now, kind="checkpoint_refused", message=message[:4000])
            raise CheckpointRefused(message)
        values.update(complete=True, manifest=manifest, size_bytes=manifests.total_bytes(manifest))
    with transaction.atomic():
        existing = Checkpoint.objects.select_for_update().filter(**key).first()
        if existing is not None and existing.complete and not existing.rejected_reason and existing.pruned_at is None:
            if values["complete"] and values["manifest"] == existing.manifest and values["uri"] == existing.uri:
                return existing  # the same declaration again (a retried post)
            raise CheckpointRefused(f"Checkpoint {existing.uri} is complete already; it cannot be changed.")
        saved, _ = Checkpoint.objects.update_or_create(**key, defaults=values)
    if saved.complete:
        prune(run)
    return saved


def prune(run: Run) -> list[str]:
    """Deletes what the run's store no longer needs (runs.retention) and marks it pruned (the row stays, so the run's
    history keeps it); returns the folders deleted. A failed delete is logged and tried again after the next one."""
    rows = list(run.checkpoints.filter(pruned_at=None))
    keep = (run.recipe.get("checkpoint") or {}).get("keep", 3)
    finals = _finals(run)
    doomed = set(retention.to_prune([retention.Stored(c.phase, c.step, c.complete, bool(c.rejected_reason))
                                     for c in rows], keep=keep if isinstance(keep, int) else 3, finals=finals))
    where, deleted = storage.location(run.bucket, run.pk), []
    for row in rows:
        if (row.phase, row.step) not in doomed:
            continue
        try:
            storage.delete_checkpoint(where, row.uri)
        except Exception:  # the store may be down; nothing is lost by trying again later
            log.warning("run %s: deleting checkpoint %s failed", run.pk, row.uri, exc_info=True)
            continue
        Checkpoint.objects.filter(pk=row.pk).update(pruned_at=timezone.now())
        deleted.append(row.uri)
    return deleted


def checkpoint_rejected(attempt: RunAttempt, phase: int, step: int, reason: str, *, now=None) -> bool:
    """The box refused to load a checkpoint (a file missing or not matching its manifest): it is never offered again.
    A box may refuse only what it is offered to resume from (`resume_points`): a box has no say over the rest of the
    run's checkpoints, such as an earlier phase's final adapter that no resume offers any more."""
    now = now or timezone.now()
    run = attempt.run
    if (phase, step) not in {(c.phase, c.step) for c in resume_points(run)}:
        return False
    found = Checkpoint.objects.filter(run=run, phase=phase, step=step, complete=True, rejected_reason="")
    if not found.update(rejected_reason=reason or "refused by the box"):
        return False
    run.events.create(at=now, kind="checkpoint_rejected",
                      message=f"The box refused checkpoint phase {phase} step {step}: {reason}"[:4000])
    return True


def _finals(run: Run) -> set[tuple[int, int]]:
    """(phase, step) of each phase's last step: the checkpoints that hold the run's adapters."""
    return {(phase.index, phase.steps) for phase in run.phases.all()}


RESUME_CANDIDATES = 3  # the newest verified checkpoints a box may try, newest first


def resume_points(run: Run) -> list[Checkpoint]:
    """The checkpoints a box may resume from, newest first: complete, with a manifest, never refused by a box. A
    half-written one is never used. Nor is one past a phase's final checkpoint that a box refused: that phase's
    adapter (an output of the run) must be trained again, from a checkpoint before it."""
    usable = run.checkpoints.filter(complete=True, rejected_reason="", pruned_at=None).exclude(manifest=None)
    finals = _finals(run)
    refused = [(c.phase, c.step) for c in run.checkpoints.filter(complete=True).exclude(rejected_reason="")
               if (c.phase, c.step) in finals]
    points = usable.order_by("-phase", "-step")
    if refused:
        points = [c for c in points if (c.phase, c.step) < min(refused)]
    return list(points[:RESUME_CANDIDATES])


def missing_outputs(run: Run) -> list[str]:
    """What a finished run lacks in its store, in words: each phase's final checkpoint (its adapter) must be complete,
    recorded with its manifest and never refused by a box."""
    stored = set(run.checkpoints.filter(complete=True, rejected_reason="", pruned_at=None).exclude(manifest=None)
                 .values_list("phase", "step"))
    return [f"the final adapter of phase {phase.name} (step {phase.steps}) is not in the run's store"
            for phase in run.phases.all() if (phase.index, phase.steps) not in stored]
