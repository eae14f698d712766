"""What the trainer reads besides a checkpoint: each phase's data, checked against its sha256, and the base model."""

import os
import shutil
import time
from functools import partial
from pathlib import Path

import httpx

from training import model_source
from training.checkpoint_names import UnsafePath, inside

from . import volume as box_volume
from .dashboard import Api
from .manifests import CheckpointMismatch, fetch_verified
from .retry import retried

DATA_TRIES = 3
FIRST_WAIT_S, MAX_WAIT_S = 2.0, 30.0


class DataRefused(Exception):
    pass


def fetch_data(phases: list[dict], recipe_phases: list[dict], folder: Path, tries: int = DATA_TRIES,
               sleep=time.sleep) -> list[dict]:
    """The recipe's phases, each one's data (and held-out eval_data) the file fetched from its read grant and checked
    against the size and sha256 recorded at upload: a mismatch is refused at once, a failed download tried again,
    then refused. A phase without data keeps its path."""
    out, fetched = [dict(phase) for phase in recipe_phases], {}  # type: list[dict], dict[str, Path]
    for phase in phases:
        for key, what in (("data", "data"), ("eval_data", "held-out data")):
            data = phase.get(key)
            if data:
                where = f"the {what} of phase {phase['index']} ({phase['name']}), {data['name']},"
                out[phase["index"]][key] = str(_fetched(data, where, folder, fetched, tries, sleep))
    return out


def _fetched(data: dict, where: str, folder: Path, fetched: dict, tries: int, sleep) -> Path:
    """The local file of one data grant, fetched once per content and checked against its sha256."""
    if data["sha256"] not in fetched:
        try:
            target = inside(folder, data["sha256"])
        except UnsafePath as exc:
            raise DataRefused(f"{where} has an unusable name: {exc}") from None
        try:
            retried(partial(fetch_verified, data, target), tries=tries, first_s=FIRST_WAIT_S, cap_s=MAX_WAIT_S,
                    retry_on=(OSError, httpx.HTTPError), sleep=sleep)
        except CheckpointMismatch as exc:
            shutil.rmtree(target, ignore_errors=True)
            raise DataRefused(f"{where} does not match its sha256 {data['sha256'][:12]}...: {exc}") from None
        except (OSError, httpx.HTTPError) as exc:
            raise DataRefused(f"{where} could not be downloaded: {type(exc).__name__}: "
                              f"{model_source.without_query(str(exc))}") from None
        fetched[data["sha256"]] = target / next(iter(data["manifest"]))
    return fetched[data["sha256"]]


def fetch_model(api: Api, grant: dict | None, model: dict, root: Path, volume: dict | None = None) -> dict:
    """The recipe's model section, its path this box's copy of a hub or s3:// model (the spec's `model` grant),
    downloaded once per box and resumable; HF_TOKEN opens a gated hub model and is never logged. With the run's
    `volume` the model is kept there, used without a download when it matches the dashboard's manifest
    (docs/runs.md, "Volumes")."""
    if not grant:
        return model
    reference = str(grant.get("repo_id") or grant.get("uri"))
    mount_path = volume["mount_path"] if volume else ""
    manifest = grant.get("manifest") if volume else None
    folder = None
    if volume:
        try:
            root = box_volume.mounted(mount_path)
        except box_volume.VolumeUnusable as exc:
            raise model_source.ModelRefused(str(exc)) from None
        if grant.get("kind") in ("hub", "s3"):
            folder = box_volume.model_folder(root, reference)
    hub = grant.get("kind") == "hub"
    checked: list[str] = []
    if manifest and folder is not None and folder.exists():
        problems = box_volume.mismatches(folder, manifest)
        if hub:  # the hub keeps no sha256 of its small files: those are downloaded afresh beside the checked weights
            checked = box_volume.keep_only(folder, manifest)
        if not problems:
            if hub:
                model_source.fetch_hub(reference, folder, revision=grant.get("revision"),
                                       token=os.environ.get("HF_TOKEN") or None, skip=checked)
            api.call("POST", "events", {"kind": "model_on_volume", "message": (
                f"The model {reference} is on the volume at {mount_path} and every one of its "
                f"{len(manifest)} files matches the manifest the dashboard recorded: no download"
                + (" of its weights (its small files, which the hub keeps no sha256 of, were fetched afresh)."
                   if hub else "."))})
            return {**model, "path": str(folder), "revision": None}
        said = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        api.call("POST", "events", {"kind": "log", "message": (
            f"The volume at {mount_path} does not hold the model {reference} as recorded ({said}): "
            "downloading it into the volume.")[:4000]})
    elif folder is not None and folder.exists():
        # No manifest to check the volume's files against (a hub model, or one the dashboard has not recorded yet):
        # what another host left there is not used.
        shutil.rmtree(folder)
    where = f"the volume at {mount_path}" if volume else "the box's disk"
    api.call("POST", "events", {"kind": "log", "message": f"Downloading the model {reference} into {where}."})
    started = time.monotonic()
    folder = model_source.fetch(grant, root, token=os.environ.get("HF_TOKEN") or None, trust_marker=not volume,
                                skip=checked)
    if manifest:
        problems = box_volume.mismatches(folder, manifest)
        if problems:
            raise model_source.ModelRefused(f"the model {reference} as downloaded does not match the manifest the "
                                            f"dashboard recorded: {'; '.join(problems[:5])}")
    done = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts)
    api.call("POST", "events", {"kind": "log", "message": f"The model {reference} is on {where}: "
                                f"{done / 1e9:.2f} GB, {time.monotonic() - started:.0f} s."})
    if manifest:
        api.call("POST", "events", {"kind": "model_on_volume", "message": (
            f"The model {reference} is on the volume at {mount_path}, every file matching the manifest "
            "the dashboard recorded: the next box that mounts it skips the download.")})
    return {**model, "path": str(folder), "revision": None}
