"""The run's base model as its box downloads it (the spec's `model`): a hub id, or an s3:// prefix's files by size with
their presigned GETs, listed and signed once per attempt (docs/runs.md, "runs/model_grants.py")."""

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from runs import model_manifests, sharing, storage
from runs.models import ModelGrant, RunAttempt
from training import model_source


def model_path(model) -> str | None:
    """The recipe's model.path when the box downloads the model, None when it builds it from a config."""
    path = model.get("path") if isinstance(model, dict) and "config" not in model else None
    return path if isinstance(path, str) else None


def grant(model, expires_s: int) -> dict | None:
    """What a box needs to download the run's base model (training.model_source.fetch), or None when it builds it
    from a config or reads a folder. An s3:// model that cannot be listed is refused in the grant's words, for the
    box to report."""
    path = model_path(model)
    if path is None:
        return None
    kind = model_source.kind_of(path)
    if kind == "hub":
        return {"kind": "hub", "repo_id": path, "revision": model.get("revision")}
    if kind == "s3":
        try:
            return storage.model_read_grant(path, expires_s)
        except storage.ModelUnreadable as exc:
            return {"kind": "refused", "uri": path, "reason": str(exc)}
    return None


def in_product_storage(path: str) -> dict:
    """The grant's refusal for a model prefix that reaches into the product's own storage."""
    return {"kind": "refused", "uri": path,
            "reason": "it lies in the product's own storage (runs' checkpoints and stored data sets), which no model "
                      "is read from"}


def reusable(expires_at: datetime, now: datetime, life_s: int) -> bool:
    """Whether a grant signed for `life_s` seconds may be answered again at `now`: while half its life is left, the
    least a box is given to start its downloads. Pure."""
    return expires_at - now >= timedelta(seconds=life_s / 2)


def for_attempt(attempt: RunAttempt, *, now: datetime | None = None) -> dict | None:
    """The spec's model for one attempt. An s3:// model's grant (or refusal) is signed on the attempt's first ask and
    answered again while reusable; a new attempt, or an old grant, is listed and signed anew."""
    now = now or timezone.now()
    model = attempt.run.recipe.get("model")
    path, life_s = model_path(model), settings.STORAGE_GRANT_S
    if path is None or model_source.kind_of(path) != "s3":
        return grant(model, life_s)
    kept = ModelGrant.objects.filter(attempt=attempt, uri=path).first()
    if kept is not None and reusable(kept.expires_at, now, life_s):
        return kept.grant
    expires_at = timezone.now() + timedelta(seconds=life_s)  # taken before signing: never later than the GETs expire
    # Checked again at every signing, not only at launch: a prefix that held nothing of the product's then may hold
    # other runs' checkpoints now, which this run's (untrusted) box must not be handed.
    fresh = in_product_storage(path) if sharing.model_in_product_storage(model, attempt.run.bucket) \
        else grant(model, life_s)
    assert fresh is not None  # an s3:// path always has a grant or a refusal
    if fresh["kind"] == "s3":
        fresh["expires_at"] = expires_at.isoformat()
    # A run keeps its current attempt's grant only: a replaced box's is of no use to anyone.
    ModelGrant.objects.filter(attempt__run_id=attempt.run_id).exclude(attempt=attempt).delete()
    ModelGrant.objects.bulk_create([ModelGrant(attempt=attempt, uri=path, grant=fresh, expires_at=expires_at)],
                                   update_conflicts=True, unique_fields=["attempt"],
                                   update_fields=["uri", "grant", "expires_at"])
    return fresh


def with_manifest(grant: dict | None, run) -> dict | None:
    """The grant with the model's manifest as the dashboard recorded it, for a run whose boxes keep the model on a
    volume: what the box checks the volume's copy against before it skips the download."""
    if not grant or not run.volume or grant.get("kind") not in ("s3", "hub"):
        return grant
    row = model_manifests.recorded(model_manifests.key(run.recipe.get("model")))
    if row is None:
        return grant
    if grant["kind"] == "hub":  # the box downloads the commit the manifest is of, whatever the branch is now
        return {**grant, "manifest": row.manifest, "revision": row.revision or None}
    return {**grant, "manifest": row.manifest}
