"""A base model's manifest as the dashboard itself read it (an s3:// model's files hashed here, a hub model's weights
by the hub's own LFS sha256 at one commit), which a box checks a volume's copy against before it skips the download;
and which volumes hold the model (docs/runs.md, "Volumes")."""

import hashlib
import os
import time

from django.conf import settings
from django.db import transaction
from huggingface_hub import HfApi
from django.utils import timezone

from fleet import enqueue
from runs import storage
from runs.models import ModelManifest, VolumeModel
from training import model_source

BUDGET_S = 420.0  # of a task's time, spent hashing before it hands the rest to the next task
CHUNK = 8 << 20


HUB = "hub:"


def key(model) -> str | None:
    """The manifest's key for a recipe's model section: its s3:// uri, hub:owner/name@revision for a hub model (the
    hub's default branch when it names none), None for a model built from a config or read from a folder."""
    path = model.get("path") if isinstance(model, dict) and "config" not in model else None
    if not isinstance(path, str):
        return None
    kind = model_source.kind_of(path)
    if kind == "s3":
        return path
    if kind == "hub":
        return f"{HUB}{path}@{model.get('revision') or 'main'}"
    return None


def wanted(model) -> bool:
    """Whether a model needs its manifest recorded (an s3:// or hub model, not recorded or under way yet); starts it."""
    uri = key(model)
    if uri is None:
        return False
    _, created = ModelManifest.objects.get_or_create(uri=uri, defaults={"started_at": timezone.now()})
    if created:
        transaction.on_commit(lambda: enqueue.record_model_manifest(uri), robust=True)
    return created


def recorded(uri: str | None) -> ModelManifest | None:
    """The model's manifest row once the dashboard has recorded it whole with at least one file (its `manifest`:
    {name: {size, sha256}}; a hub model's `revision`: the commit it is of), or None."""
    row = ModelManifest.objects.filter(uri=uri, complete=True).first() if uri else None
    return row if row is not None and row.manifest else None


def record(uri: str, *, budget_s: float = BUDGET_S, clock=time.monotonic) -> bool:
    """Records the model's manifest: a hub model's at once, an s3:// model's files not hashed yet until `budget_s`
    is spent; True once whole. The files are listed once, when the recording begins: a model changed under its prefix
    (or a branch moved on the hub) later is another model."""
    row, _ = ModelManifest.objects.get_or_create(uri=uri, defaults={"started_at": timezone.now()})
    if row.complete:
        return True
    try:
        return _record_hub(row) if uri.startswith(HUB) else _record_s3(row, uri, budget_s, clock)
    except Exception:
        row.delete()  # the hub or the store failed: the next launch that keeps this model on a volume asks again
        raise


def _record_s3(row: ModelManifest, uri: str, budget_s: float, clock) -> bool:
    if not row.files:
        row.files = storage.model_files(uri)
        row.save(update_fields=["files"])
    bucket, prefix = model_source.s3_parts(uri)
    started = clock()
    for name, size in sorted(row.files.items()):
        if name in row.manifest:
            continue
        if clock() - started > budget_s:
            return False
        row.manifest[name] = {"size": size, "sha256": _object_sha256(bucket, prefix + name, size)}
        row.save(update_fields=["manifest"])
    row.complete, row.recorded_at = True, timezone.now()
    row.save(update_fields=["complete", "recorded_at"])
    return True


def _record_hub(row: ModelManifest) -> bool:
    """A hub model's weights as the hub lists them at its revision: each LFS file's size and sha256, and the commit.
    The small files the hub keeps no sha256 for (config, tokenizer) are not in it: a box downloads those afresh."""
    repo_id, _, revision = row.uri.removeprefix(HUB).rpartition("@")
    api = HfApi(endpoint=settings.HF_ENDPOINT or None, token=os.environ.get("HF_TOKEN") or None)
    info = api.model_info(repo_id, revision=revision, files_metadata=True)
    row.manifest = {sibling.rfilename: {"size": sibling.lfs.size, "sha256": sibling.lfs.sha256}
                    for sibling in info.siblings or () if sibling.lfs is not None}
    row.files = {name: entry["size"] for name, entry in row.manifest.items()}
    row.revision, row.complete, row.recorded_at = info.sha or "", True, timezone.now()
    row.save(update_fields=["manifest", "files", "revision", "complete", "recorded_at"])
    return True


def _object_sha256(bucket: str, key: str, size: int) -> str:
    """The object's sha256, read through the dashboard's client; ValueError when it is not the size listed."""
    digest, read = hashlib.sha256(), 0
    body = storage.s3_client().get_object(Bucket=bucket, Key=key)["Body"]
    for chunk in body.iter_chunks(CHUNK):
        digest.update(chunk)
        read += len(chunk)
    if read != size:
        raise ValueError(f"s3://{bucket}/{key} is {read:,} bytes, not the {size:,} listed")
    return digest.hexdigest()


def holds(volume: dict, model) -> bool:
    """Whether a box said the run's volume holds this model, every file matching the recorded manifest."""
    uri = key(model)
    if not volume or recorded(uri) is None:
        return False
    return VolumeModel.objects.filter(provider=volume["provider"], volume_id=volume["id"], uri=uri).exists()


def box_says_held(run, now) -> None:
    """A box of the run found (or made) the model on its volume, matching the manifest: remembered for the ranking."""
    uri = key(run.recipe.get("model"))
    if not run.volume or uri is None:
        return
    VolumeModel.objects.update_or_create(provider=run.volume["provider"], volume_id=run.volume["id"], uri=uri,
                                         defaults={"verified_at": now, "run": run})
