"""A run's checkpoints as the dashboard records them: declared by its box, verified against the store, offered for
resume newest first, pruned to the recipe's keep count, and checked for the run's final adapters when it finishes."""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet import enqueue, locks
from runs import events, manifests, retention, storage
from runs.models import Checkpoint, Run, RunAttempt
from training.recipe import EVAL_KIND

log = logging.getLogger(__name__)
# A checkpoint this small is sealed within its completion request (a few seconds of copying at most, inside the
# agent's 10 s call); a larger one by a task (runs.tasks.seal_checkpoint), so no request waits minutes on a copy.
SEAL_INLINE_BYTES = 256 * 1024**2
RESEAL_AFTER_S = 120  # a complete checkpoint still unsealed this long after its completion is queued again


class CheckpointRefused(Exception):
    """A checkpoint notice the dashboard does not record (the agent API answers 409 with the reason)."""


class StillSealing(Exception):
    """A run's final checkpoint is complete but not yet sealed: its box's 'finished' is answered 503, to be sent
    again shortly (docs/runs.md, "runs/checkpoints.py")."""


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
              "rejected_reason": "", "pruned_at": None, "written_by": attempt, "written_etags": None, "sealed_at": None}
    if notice["complete"]:
        try:
            manifest = manifests.validated(notice.get("manifest"))
        except manifests.ManifestError as exc:
            raise CheckpointRefused(f"Checkpoint {notice['uri']}: {exc}.") from None
        settled = run.checkpoints.filter(**key, complete=True, rejected_reason="", pruned_at=None).first()
        if settled is not None and settled.manifest == manifest and settled.uri == notice["uri"]:
            return settled  # the same declaration again (a retried post): its upload may be sealed and gone by now
        try:  # the box's own attempt folder, where no other box can write: only the manifest's files count
            written = storage.written_files(storage.location(run.bucket, run.pk), notice["uri"], attempt.pk)
        except storage.TooManyObjects as exc:
            events.box_news(run, "checkpoint_refused", f"Checkpoint {notice['uri']}: {exc}."[:4000], now)
            raise CheckpointRefused(f"Checkpoint {notice['uri']}: {exc}.") from None
        problems = manifests.missing_from_store(manifest, {name: size for name, (size, _) in written.items()})
        if problems:
            message = f"Checkpoint {notice['uri']} is not complete in the store: {'; '.join(problems[:5])}."
            events.box_news(run, "checkpoint_refused", message[:4000], now)
            raise CheckpointRefused(message)
        values.update(complete=True, manifest=manifest, size_bytes=manifests.total_bytes(manifest),
                      written_etags={name: written[name][1] for name in manifest})
    with transaction.atomic():
        existing = Checkpoint.objects.select_for_update().filter(**key).first()
        if existing is not None and existing.complete and not existing.rejected_reason and existing.pruned_at is None:
            if values["complete"] and values["manifest"] == existing.manifest and values["uri"] == existing.uri:
                return existing  # the same declaration again (a retried post)
            raise CheckpointRefused(f"Checkpoint {existing.uri} is complete already; it cannot be changed.")
        saved, _ = Checkpoint.objects.update_or_create(**key, defaults=values)
    if saved.complete:
        if (saved.size_bytes or 0) <= SEAL_INLINE_BYTES:
            seal(saved.pk, now=now)
            saved.refresh_from_db()
        else:
            transaction.on_commit(lambda: enqueue.seal_checkpoint(saved.pk), robust=True)
    return saved


def seal(checkpoint_pk: int, *, now: datetime | None = None) -> bool:
    """Copies a complete checkpoint's manifest files from its writer's attempt folder to the run's sealed folder,
    where no box can write, and records it sealed; only then is it resumed from or served. A copy that fails
    (a file changed since it was checked) refuses the checkpoint (docs/runs.md, "runs/checkpoints.py")."""
    with locks.claim(f"runs.seal.{checkpoint_pk}") as held:
        if not held:
            return False  # another worker is sealing it
        row = (Checkpoint.objects.select_related("run").exclude(manifest=None).exclude(written_by=None)
               .filter(pk=checkpoint_pk, complete=True, sealed_at=None, rejected_reason="", pruned_at=None).first())
        if row is None:
            return False
        run, where = row.run, storage.location(row.run.bucket, row.run.pk)
        try:
            storage.seal(where, row.uri, row.written_by_id, row.manifest, row.written_etags or {})
        except storage.SealFailed as exc:
            if Checkpoint.objects.filter(pk=row.pk, sealed_at=None, rejected_reason="").update(
                    rejected_reason=f"not sealed: {exc}"[:4000]):
                message = f"Checkpoint {row.uri} could not be sealed: {exc}. It is never offered."
                run.events.create(at=now or timezone.now(), kind="checkpoint_refused", message=message[:4000])
            return False
        if not Checkpoint.objects.filter(pk=row.pk, sealed_at=None, rejected_reason="", pruned_at=None,
                                         written_by=row.written_by_id).update(sealed_at=now or timezone.now()):
            return False
        try:  # what the box uploaded is not needed any more; its attempt folder is emptied later in any case
            storage.delete_checkpoint(where, row.uri, row.written_by_id)
        except Exception:
            log.warning("run %s: deleting the upload of %s failed", run.pk, row.uri, exc_info=True)
    prune(run)
    return True


def unsealed(run: Run):
    """The run's complete checkpoints waiting to be sealed: never refused, never pruned."""
    return run.checkpoints.filter(complete=True, sealed_at=None, rejected_reason="", pruned_at=None).exclude(
        manifest=None)


def tend_store(run: Run, now: datetime) -> None:
    """Part of each supervisor pass: queues again a seal whose task was lost, and empties the attempt folders of
    ended attempts once their last upload grant has expired (a box's leftovers, never read)."""
    for pk in unsealed(run).filter(created_at__lt=now - timedelta(seconds=RESEAL_AFTER_S)).values_list("pk",
                                                                                                     flat=True):
        try:
            enqueue.seal_checkpoint(pk)
        except enqueue.QueueUnavailable:
            break
    expired = now - timedelta(seconds=settings.STORAGE_UPLOAD_GRANT_S)
    pending = set(unsealed(run).values_list("written_by", flat=True))
    where = storage.location(run.bucket, run.pk)
    for attempt in run.attempts.filter(ended_at__lt=expired, uploads_deleted_at=None).exclude(pk__in=pending):
        try:
            storage.delete_attempt(where, attempt.pk)
        except Exception:  # the store may be down; tried again next pass
            log.warning("run %s: emptying attempt %s's folder failed", run.pk, attempt.pk, exc_info=True)
            continue
        RunAttempt.objects.filter(pk=attempt.pk).update(uploads_deleted_at=now)


def prune(run: Run) -> list[str]:
    """Deletes what the run's store no longer needs (runs.retention) and marks it pruned (the row stays, so the run's
    history keeps it); returns the folders deleted. A failed delete is logged and tried again after the next one."""
    rows = list(run.checkpoints.filter(pruned_at=None))
    keep = (run.recipe.get("checkpoint") or {}).get("keep", 3)
    finals = _finals(run)
    # Only a sealed checkpoint counts as stored: one still being sealed may yet fail, and is left to its seal.
    sealing = {(c.phase, c.step) for c in rows if c.complete and c.sealed_at is None and not c.rejected_reason}
    doomed = set(retention.to_prune([retention.Stored(c.phase, c.step, c.complete and c.sealed_at is not None,
                                                      bool(c.rejected_reason)) for c in rows],
                                    keep=keep if isinstance(keep, int) else 3, finals=finals)) - sealing
    where, deleted = storage.location(run.bucket, run.pk), []
    for row in rows:
        if (row.phase, row.step) not in doomed:
            continue
        try:
            storage.delete_checkpoint(where, row.uri)
            if row.written_by_id is not None:
                storage.delete_checkpoint(where, row.uri, row.written_by_id)
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
    """(phase, step) of each training phase's last step: the checkpoints that hold the run's adapters (an eval phase
    trains nothing)."""
    return {(phase.index, phase.steps) for phase in run.phases.exclude(kind=EVAL_KIND)}


RESUME_CANDIDATES = 3  # the newest verified checkpoints a box may try, newest first


def resume_points(run: Run) -> list[Checkpoint]:
    """The checkpoints a box may resume from, newest first: sealed, with a manifest, never refused by a box. A
    half-written or unsealed one is never used. Nor is one past a phase's final checkpoint that a box refused: that
    phase's adapter (an output of the run) must be trained again, from a checkpoint before it."""
    usable = run.checkpoints.filter(complete=True, rejected_reason="", pruned_at=None).exclude(manifest=None).exclude(
        sealed_at=None)
    finals = _finals(run)
    refused = [(c.phase, c.step) for c in run.checkpoints.filter(complete=True).exclude(rejected_reason="")
               if (c.phase, c.step) in finals]
    points = usable.order_by("-phase", "-step")
    if refused:
        points = [c for c in points if (c.phase, c.step) < min(refused)]
    return list(points[:RESUME_CANDIDATES])


def finals_sealing(run: Run) -> list[str]:
    """The folders of the run's phase-final checkpoints that are complete and still being sealed."""
    finals = _finals(run)
    return [c.uri for c in unsealed(run) if (c.phase, c.step) in finals]


def missing_outputs(run: Run) -> list[str]:
    """What a finished run lacks in its store, in words: each phase's final checkpoint (its adapter) must be sealed,
    recorded with its manifest and never refused by a box."""
    stored = set(run.checkpoints.filter(complete=True, rejected_reason="", pruned_at=None).exclude(manifest=None)
                 .exclude(sealed_at=None).values_list("phase", "step"))
    return [f"the final adapter of phase {phase.name} (step {phase.steps}) is not in the run's store"
            for phase in run.phases.exclude(kind=EVAL_KIND) if (phase.index, phase.steps) not in stored]
