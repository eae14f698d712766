"""An s3:// base model's manifest as the dashboard itself read it (every file's size and sha256, a few files per task),
which a box checks a volume's copy of the model against before it skips the download; and which volumes a box said
hold the model (docs/runs.md, "Volumes")."""

import hashlib
import time

from django.db import transaction
from django.utils import timezone

from fleet import enqueue
from runs import storage
from runs.models import ModelManifest, VolumeModel
from training import model_source

BUDGET_S = 420.0  # of a task's time, spent hashing before it hands the rest to the next task
CHUNK = 8 << 20


def wanted(uri: str) -> bool:
    """Whether a model needs its manifest recorded (an s3:// model, not recorded or under way yet); starts it."""
    if model_source.kind_of(uri) != "s3":
        return False
    _, created = ModelManifest.objects.get_or_create(uri=uri, defaults={"started_at": timezone.now()})
    if created:
        transaction.on_commit(lambda: enqueue.record_model_manifest(uri), robust=True)
    return created


def recorded(uri: str) -> dict[str, dict] | None:
    """{name: {size, sha256}} of a model the dashboard has hashed whole, or None."""
    row = ModelManifest.objects.filter(uri=uri, complete=True).first()
    return row.manifest if row is not None else None


def record(uri: str, *, budget_s: float = BUDGET_S, clock=time.monotonic) -> bool:
    """Hashes the model's files not hashed yet, until `budget_s` is spent; True once every file is. The files are
    listed once, when the recording begins: a model changed under its prefix later is another model."""
    row, _ = ModelManifest.objects.get_or_create(uri=uri, defaults={"started_at": timezone.now()})
    if row.complete:
        return True
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


def holds(volume: dict, uri: str | None) -> bool:
    """Whether a box said the run's volume holds this model, every file matching the recorded manifest."""
    if not volume or not uri or recorded(uri) is None:
        return False
    return VolumeModel.objects.filter(provider=volume["provider"], volume_id=volume["id"], uri=uri).exists()


def box_says_held(run, now) -> None:
    """A box of the run found (or made) the model on its volume, matching the manifest: remembered for the ranking."""
    uri = (run.recipe.get("model") or {}).get("path")
    if not run.volume or not isinstance(uri, str):
        return
    VolumeModel.objects.update_or_create(provider=run.volume["provider"], volume_id=run.volume["id"], uri=uri,
                                         defaults={"verified_at": now, "run": run})
