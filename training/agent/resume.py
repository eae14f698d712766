"""Resuming on a new box: the newest checkpoint that verifies, put where the trainer looks for one."""

import logging
import shutil
import time
from pathlib import Path

import httpx

from training import model_source
from training.checkpoint_names import MARKER, UnsafePath, inside

from .dashboard import Api
from .manifests import CheckpointMismatch, fetch_verified
from .retry import retried

log = logging.getLogger(__name__)

RESTORE_TRIES = 4  # a candidate's download, tried this often before the box gives up on it
FIRST_WAIT_S, MAX_WAIT_S = 2.0, 30.0


class RestoreFailed(Exception):
    """A checkpoint could not be fetched though nothing says it is wrong: the network, the store or this box's disk
    failed. The checkpoint is not rejected, so the box that replaces this one is offered it again."""


def restore(api: Api, candidates: list[dict], store: Path, *, tries: int | None = None,
            sleep=time.sleep) -> dict | None:
    """Puts the newest checkpoint that verifies (each file of its recorded manifest, by size and sha256) into the
    trainer's store, its marker last, and returns it. A mismatch rejects that one for the next older; a failed
    download rejects nothing and raises RestoreFailed after `tries` (docs/agent.md says why)."""
    for candidate in candidates or []:
        target = None
        try:
            target = inside(store, Path(candidate["uri"]).name)
            _fetch_retried(candidate, target, tries or RESTORE_TRIES, sleep)
        except (CheckpointMismatch, UnsafePath) as exc:
            if target is not None:
                shutil.rmtree(target, ignore_errors=True)
            reason = model_source.without_query(f"{type(exc).__name__}: {exc}")
            log.warning("checkpoint %s refused: %s", candidate["uri"], reason)
            api.call("POST", "checkpoints/rejected", {"phase": candidate["phase"], "step": candidate["step"],
                                                      "reason": reason})
            continue
        (target / MARKER).write_text(f"{time.time()}\n")
        return candidate
    return None


def _fetch_retried(candidate: dict, target: Path, tries: int, sleep) -> None:
    """fetch_verified, tried again after a failure of the transport or the disk; a mismatch is raised at once, and
    so is a 404 (the store says the file is not there, as a local store's missing file does)."""

    def fetch():
        try:
            fetch_verified(candidate, target)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                raise CheckpointMismatch(f"a file is not in the store: {exc}") from None
            raise

    def failed(attempt: int, error: Exception):
        shutil.rmtree(target, ignore_errors=True)
        log.warning("checkpoint %s: download %d of %d failed: %s", candidate["uri"], attempt, tries,
                    model_source.without_query(f"{type(error).__name__}: {error}"))

    try:
        retried(fetch, tries=tries, first_s=FIRST_WAIT_S, cap_s=MAX_WAIT_S, retry_on=(OSError, httpx.HTTPError),
                on_failure=failed, sleep=sleep)
    except (OSError, httpx.HTTPError) as error:
        raise RestoreFailed(model_source.without_query(
            f"The checkpoint {candidate['uri']} could not be downloaded after {tries} tries: {type(error).__name__}: "
            f"{error}")) from None
