"""Checkpoints that survive a dead host: written to a local folder or any S3-compatible store, marker last
(docs/training.md, "training/checkpoint.py")."""

import logging
import os
import random
import shutil
import threading
import time
from pathlib import Path

import torch

from training.checkpoint_names import MARKER, checkpoint_name, inside, parse_name

_log = logging.getLogger(__name__)


class LocalStore:
    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def names(self):
        """{name: complete?} of every checkpoint folder in the store."""
        return {p.name: (p / MARKER).exists() for p in self.root.iterdir() if p.is_dir() and parse_name(p.name)}

    def upload(self, local_dir, name):
        target = self.root / name
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file() and path.name != MARKER:
                dest = target / path.relative_to(local_dir)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
        (target / MARKER).write_text(f"{time.time()}\n")

    def download(self, name, local_dir):
        shutil.copytree(self.root / name, local_dir, dirs_exist_ok=True)

    def delete(self, name):
        (self.root / name / MARKER).unlink(missing_ok=True)  # first, so a half-deleted one is never complete
        shutil.rmtree(self.root / name, ignore_errors=True)


class S3Store:
    """s3://bucket/prefix on S3, R2, MinIO or anything else boto3 talks to (endpoint_url, region)."""

    def __init__(self, url, endpoint_url=None, region=None):
        import boto3

        bucket, _, prefix = url[len("s3://"):].partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)

    def _key(self, *parts):
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _keys(self, prefix):
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [obj["Key"] for obj in page.get("Contents", [])]
        return keys

    def names(self):
        found = {}
        root = self._key() + "/" if self.prefix else ""
        for key in self._keys(root):
            name, _, rest = key[len(root):].partition("/")
            if parse_name(name):
                found[name] = found.get(name, False) or rest == MARKER
        return found

    def upload(self, local_dir, name):
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file() and path.name != MARKER:
                self.client.upload_file(str(path), self.bucket, self._key(name, path.relative_to(local_dir).as_posix()))
        self.client.put_object(Bucket=self.bucket, Key=self._key(name, MARKER), Body=f"{time.time()}\n".encode())

    def download(self, name, local_dir):
        root = self._key(name) + "/"
        for key in self._keys(root):
            dest = inside(local_dir, key[len(root):])
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(self.bucket, key, str(dest))

    def delete(self, name):
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name, MARKER))
        keys = self._keys(self._key(name) + "/")
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[start:start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk})


def open_store(config):
    """The store a recipe's `checkpoint` section names."""
    if str(config["store"]).startswith("s3://"):
        return S3Store(config["store"], config.get("endpoint_url"), config.get("region"))
    return LocalStore(config["store"])


def latest_complete(store):
    """Name of the newest checkpoint that has its completion marker, or None."""
    complete = [name for name, done in store.names().items() if done]
    return max(complete, key=parse_name) if complete else None


def prune(store, keep, protected=frozenset()):
    """Keep the newest `keep` complete checkpoints and the `protected` ones (each phase's final: the run's outputs);
    drop older ones and unfinished ones older than the newest."""
    names = store.names()
    complete = sorted((n for n, done in names.items() if done), key=parse_name)
    newest = parse_name(complete[-1]) if complete else None
    for name in complete[:-keep]:
        if name not in protected:
            store.delete(name)
    for name, done in names.items():
        if not done and newest and parse_name(name) < newest:
            store.delete(name)


def phase_finals(phases) -> frozenset:
    """The names of each phase's final checkpoint, which hold the run's adapters."""
    return frozenset(checkpoint_name(index, phase["steps"]) for index, phase in enumerate(phases))


def rng_state():
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Uploader:
    """Snapshots a checkpoint to local staging, then uploads it and prunes in a background thread."""

    def __init__(self, store, staging_root, keep, attempts=3, protected=frozenset()):
        self.store, self.staging_root, self.keep, self.attempts = store, Path(staging_root), keep, attempts
        self.protected = protected
        self._thread, self._error = None, None
        shutil.rmtree(self.staging_root, ignore_errors=True)  # left over from a killed run

    def save(self, model, trainer_state, name, exports=()):
        """Write the snapshot now (the caller's tensors may change right after) and upload it in the background.
        exports: functions of the snapshot folder that write more into it first (a final one's `vllm/` adapter);
        the snapshot is uploaded even when one raises, and the error still reaches the caller."""
        self.wait()
        local = self.staging_root / name
        shutil.rmtree(local, ignore_errors=True)
        model.save_pretrained(local / "adapter")
        torch.save(trainer_state, local / "trainer.pt")
        try:
            for export in exports:
                export(local)
        finally:
            self._thread = threading.Thread(target=self._upload, args=(local, name), name=f"upload-{name}",
                                            daemon=True)
            self._thread.start()

    def _upload(self, local, name):
        for attempt in range(1, self.attempts + 1):
            try:
                self.store.upload(local, name)
                prune(self.store, self.keep, self.protected)
                shutil.rmtree(local, ignore_errors=True)
                return
            except Exception as exc:  # noqa: BLE001 - any store failure is retried, then reported by wait()
                _log.warning("checkpoint %s upload attempt %d failed: %s", name, attempt, exc)
                if attempt == self.attempts:
                    self._error = exc
                else:
                    time.sleep(2 ** attempt)

    def wait(self):
        """Block until the upload in flight is done; raise if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"checkpoint upload failed: {error}") from error


def load(store, name, local_dir):
    """Download checkpoint `name` and return (adapter state dict, trainer state)."""
    from safetensors.torch import load_file

    local_dir = Path(local_dir)
    shutil.rmtree(local_dir, ignore_errors=True)
    store.download(name, local_dir)
    if not (local_dir / MARKER).exists():
        raise RuntimeError(f"checkpoint {name} lost its completion marker while being read")
    adapter = load_file(os.fspath(local_dir / "adapter" / "adapter_model.safetensors"))
    # Tensors and plain values only: a pickle that names any other object (code a box could have put there) raises.
    trainer_state = torch.load(local_dir / "trainer.pt", weights_only=True)
    return adapter, trainer_state
