"""Checkpoints going up to the run's bucket, on a thread of their own so a slow uplink never holds up the heartbeat."""

import logging
import os
import shutil
import threading
import time
from pathlib import Path

import httpx

from training.checkpoint_names import MARKER, parse_name

from .dashboard import Api
from .manifests import manifest_of
from .retry import retried

log = logging.getLogger(__name__)


class Uploader(threading.Thread):
    """Uploads complete checkpoints, files first and the marker last, then tells the dashboard. Each is snapshotted
    with hard links when offered; a newer one replaces any still waiting, but a phase's final (`protected`) is never
    skipped and is tried again (docs/agent.md)."""

    ATTEMPTS = 3  # of a protected checkpoint; any other is tried once, a newer one follows
    FIRST_WAIT_S, MAX_WAIT_S = 2.0, 30.0

    def __init__(self, api: Api, grant: dict, outbox: Path, before_complete=lambda: None,
                 protected=frozenset()):
        super().__init__(name="checkpoint-uploads", daemon=True)
        self.api, self.grant, self.outbox, self.protected = api, grant, outbox, protected
        # Called before a checkpoint is declared complete: the steps it covers must reach the dashboard first, or a
        # box that resumes past them would leave them unreported.
        self.before_complete = before_complete
        self.offered: set[str] = set()
        self.uploaded: list[str] = []
        self._cv = threading.Condition()
        self._waiting: list[Path] = []
        self._busy = False
        self._closed = False

    def offer(self, folder: Path) -> None:
        if folder.name in self.offered:
            return
        self.offered.add(folder.name)
        snapshot = self.outbox / folder.name
        try:
            link_tree(folder, snapshot)
        except FileNotFoundError:  # pruned by the trainer before we got to it: a newer one exists
            shutil.rmtree(snapshot, ignore_errors=True)
            return
        with self._cv:
            for skipped in [w for w in self._waiting if w.name not in self.protected]:
                shutil.rmtree(skipped, ignore_errors=True)
                self._waiting.remove(skipped)
            self._waiting.append(snapshot)
            self._cv.notify_all()

    def renew(self, grant: dict) -> None:
        self.grant = grant  # read once per file, so an upload in flight moves to the new grant at its next file

    def pending(self) -> int:
        with self._cv:
            return len(self._waiting) + int(self._busy)

    def close(self) -> None:
        """Waits for the upload in flight and those waiting, then ends the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            while self._waiting or self._busy:
                self._cv.wait()

    def run(self):
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if not self._waiting:
                    return
                job, self._busy = self._waiting.pop(0), True
            try:
                self._upload_once_or_more(job)
                self.uploaded.append(job.name)
            except Exception as exc:  # noqa: BLE001 - a failed upload must not kill the agent; a newer one follows
                log.warning("upload of %s failed: %s", job.name, exc)
            finally:
                shutil.rmtree(job, ignore_errors=True)
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _upload_once_or_more(self, folder: Path):
        attempts = self.ATTEMPTS if folder.name in self.protected else 1
        return retried(lambda: self._upload(folder), tries=attempts, first_s=self.FIRST_WAIT_S,
                       cap_s=self.MAX_WAIT_S, retry_on=(Exception,))

    def _upload(self, folder: Path):
        phase, step = parse_name(folder.name)
        self.api.call("POST", "checkpoints", {"phase": phase, "step": step, "uri": folder.name, "complete": False})
        manifest = manifest_of(folder)  # hashed from the snapshot, as it is uploaded
        for name in manifest:
            self._put(folder / name, f"{folder.name}/{name}")
        self._put(folder / MARKER, f"{folder.name}/{MARKER}")
        self.before_complete()
        self.api.call("POST", "checkpoints", {"phase": phase, "step": step, "uri": folder.name, "complete": True,
                                              "manifest": manifest})

    def _put(self, path: Path, key: str):
        grant = self.grant
        if grant["kind"] == "local":
            target = Path(grant["path"]) / key
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            # A simulated box's uplink: a real one is as slow as its network, a local copy is instant.
            uplink_mbps = float(os.environ.get("FLEET_SIM_UPLINK_MBPS") or 0)
            if uplink_mbps > 0:
                time.sleep(path.stat().st_size * 8 / 1e6 / uplink_mbps)
            return
        fields = {**grant["fields"], "key": grant["prefix"] + key}
        with open(path, "rb") as f, httpx.Client(timeout=None) as http:
            response = http.post(grant["url"], data=fields, files={"file": (path.name, f)})
        response.raise_for_status()


def link_tree(source: Path, target: Path) -> None:
    """Hard-links a checkpoint folder (same disk, no copying), its completion marker last."""
    files = sorted(p for p in source.rglob("*") if p.is_file())
    for path in sorted(files, key=lambda p: p.name == MARKER):
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, dest)


def complete_checkpoints(store: Path) -> list[Path]:
    """The store's checkpoints that carry their completion marker, oldest first."""
    if not store.exists():
        return []
    found = [p for p in store.iterdir() if p.is_dir() and parse_name(p.name) and (p / MARKER).exists()]
    return sorted(found, key=lambda p: parse_name(p.name))
