"""What the trainer reads besides a checkpoint: each phase's data, checked against its sha256, and the base model."""

import json
import os
import shutil
import time
from functools import partial
from pathlib import Path

import httpx

from training import model_source
from training.checkpoint_names import UnsafePath, inside

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


def fetch_model(api: Api, grant: dict | None, model: dict, root: Path) -> dict:
    """The recipe's model section, its path this box's copy of a hub or s3:// model (the spec's `model` grant),
    downloaded once per box and resumable; a model from a config or a folder is left as it is. HF_TOKEN opens a
    gated or private hub model and is never logged."""
    if not grant:
        return model
    reference = grant.get("repo_id") or grant.get("uri")
    api.call("POST", "events", {"kind": "log", "message": f"Downloading the model {reference} into the box's disk."})
    started = time.monotonic()
    folder = model_source.fetch(grant, root, token=os.environ.get("HF_TOKEN") or None)
    done = json.loads((folder / model_source.DONE).read_text())
    api.call("POST", "events", {"kind": "log", "message": f"The model {reference} is on the box's disk: "
                                f"{done['bytes'] / 1e9:.2f} GB, {time.monotonic() - started:.0f} s."})
    return {**model, "path": str(folder), "revision": None}
