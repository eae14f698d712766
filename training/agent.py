"""The on-box agent, the worker image's entry point: `python -m training.agent`.

It proves the install with the import probe, fetches the run's spec with the run's token, restores the newest
complete checkpoint (one it cannot download is kept, and the box exits for another to resume from it), fetches each
phase's data and checks its sha256, downloads a hub or s3:// base model into the box's disk once (resumable), runs
the trainer as a child process, and while it trains: forwards the trainer's per-step metrics in batches, uploads
each complete checkpoint (files first, the completion marker last) on a thread of its own so a slow uplink never
holds up the heartbeat, and heartbeats. Each heartbeat answer renews its credentials; if none renews them for the
dead-man window it stops the trainer (which checkpoints on SIGTERM), uploads what is left and stops its own machine,
so a dead control plane cannot leave a box billing. Imports no Django.

Environment: FLEET_API_URL, FLEET_AGENT_TOKEN (the box's own token), FLEET_WORKDIR (default ./fleet-run),
FLEET_MODEL_TYPE (the run's model type, for the probe),
FLEET_SELF_STOP (a shell command that stops this machine), or on vast.ai CONTAINER_ID / CONTAINER_API_KEY (the
container's own key, which can stop it); HF_TOKEN for a gated or private hub model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from training import model_source
from training.checkpoint_names import MARKER, UnsafePath, checkpoint_name, inside, parse_name
from training.metric_fields import wire_point
from training.probe import SENTINEL as PROBE_SENTINEL

log = logging.getLogger("training.agent")


class Refused(ValueError):
    """The dashboard answered 4xx: what we sent is wrong, or (401) this box's token no longer opens anything."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class Api:
    """The dashboard's agent API, retried with backoff; a 4xx is a bug in what we sent, not worth retrying."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0, attempts: int = 4):
        self.http = httpx.Client(base_url=base_url.rstrip("/") + "/", timeout=timeout_s,
                                 headers={"Authorization": f"Bearer {token}"})
        self.attempts = attempts

    def call(self, method: str, path: str, body=None):
        for attempt in range(self.attempts):
            try:
                response = self.http.request(method, path, json=body)
            except httpx.TransportError as exc:
                error = f"{type(exc).__name__}"
            else:
                if response.status_code < 400:
                    return response.json()
                if response.status_code < 500 and response.status_code != 429:
                    raise Refused(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}",
                                  response.status_code)
                error = f"HTTP {response.status_code}"
            time.sleep(min(8.0, 0.5 * 2**attempt))
        raise ConnectionError(f"{method} {path}: {error} after {self.attempts} tries")


def probe(python: str) -> tuple[bool, str]:
    """Runs the import probe; it passed only if it exited 0 and printed the sentinel (exit codes alone lie). With the
    run's model type (FLEET_MODEL_TYPE) it also checks the kernels that family needs (FLA for Gated DeltaNet)."""
    family = os.environ.get("FLEET_MODEL_TYPE", "")
    command = [python, "-m", "training.probe", *(["--family", family] if family else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return False, "the import probe timed out"
    output = (done.stdout + done.stderr)[-3000:]
    return done.returncode == 0 and PROBE_SENTINEL in done.stdout, output


def gpu_status() -> dict:
    """GPU utilisation and whether the GPU answers at all (nvidia-smi hangs or fails on a wedged GPU). A field it
    cannot read (`[N/A]`, `[Not Supported]`) is left out rather than guessed."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (subprocess.TimeoutExpired, OSError):
        return {"gpu_ok": False}
    if out.returncode != 0:
        return {"gpu_ok": False}
    rows = [[_reading(cell) for cell in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]
    if not rows:
        return {"gpu_ok": False}
    status = {"gpu_ok": True}
    utils = [r[0] for r in rows if r and r[0] is not None and 0 <= r[0] <= 100]
    if utils:
        status["gpu_util_percent"] = sum(utils) / len(utils)
    mems = [r[1] for r in rows if len(r) > 1 and r[1] is not None and r[1] >= 0]
    if mems:
        status["gpu_mem_gib"] = sum(mems) / 1024  # nvidia-smi says MiB
    return status


def _reading(cell: str) -> float | None:
    try:
        value = float(cell.strip())
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def to_point(record: dict) -> dict:
    return wire_point({"time": time.time(), **record})


RESTORE_TRIES = 4  # a candidate's download, tried this often before the box gives up on it


class RestoreFailed(Exception):
    """A checkpoint could not be fetched though nothing says it is wrong: the network, the store or this box's disk
    failed. The checkpoint is not rejected, so the box that replaces this one is offered it again."""


def restore(api: Api, candidates: list[dict], store: Path, *, tries: int | None = None,
            sleep=time.sleep) -> dict | None:
    """Puts the newest checkpoint that verifies into the trainer's store, its marker last, and returns it.

    Only the files of the manifest the dashboard recorded are fetched, each checked for its size and sha256 before
    the marker is written; a candidate whose files are not what its manifest says (missing, another size or sha256,
    a name outside its folder) is removed, reported as rejected and skipped for the next older one. A failed download
    (refused or reset connection, timeout, a 5xx, an expired grant's 403, a full disk) is no evidence against the
    checkpoint: it is tried `tries` (RESTORE_TRIES) times with a short backoff, then RestoreFailed is raised and
    nothing is rejected, so the run resumes from it on another box instead of retraining from an older one or from
    scratch (a rejected checkpoint is never offered again and retention deletes it). Nothing unverified is ever left
    where the trainer would load it."""
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
    for attempt in range(1, tries + 1):
        try:
            fetch_verified(candidate, target)
            return
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                raise CheckpointMismatch(f"a file is not in the store: {exc}") from None
            error = exc
        except (OSError, httpx.HTTPError) as exc:
            error = exc
        shutil.rmtree(target, ignore_errors=True)
        log.warning("checkpoint %s: download %d of %d failed: %s", candidate["uri"], attempt, tries,
                    model_source.without_query(f"{type(error).__name__}: {error}"))
        if attempt < tries:
            sleep(min(30.0, 2.0 * 2 ** (attempt - 1)))
    raise RestoreFailed(model_source.without_query(
        f"The checkpoint {candidate['uri']} could not be downloaded after {tries} tries: {type(error).__name__}: "
        f"{error}"))


class CheckpointMismatch(Exception):
    pass


def fetch_verified(candidate: dict, target: Path) -> None:
    manifest, grant = candidate["manifest"], candidate["download"]
    shutil.rmtree(target, ignore_errors=True)
    for name, entry in sorted(manifest.items()):
        dest = inside(target, name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if grant["kind"] == "local":
            source = inside(grant["path"], name)
            if source.is_symlink() or not source.is_file():
                raise CheckpointMismatch(f"{name} is missing from the store")
            shutil.copyfile(source, dest)
        else:
            url = grant["files"].get(name)
            if not url:
                raise CheckpointMismatch(f"no download was granted for {name}")
            download(url, dest, limit=entry["size"])
        size, digest = file_digest(dest)
        if size != entry["size"] or digest != entry["sha256"]:
            raise CheckpointMismatch(f"{name} does not match its manifest ({size} bytes, sha256 {digest[:12]}...)")


class DataRefused(Exception):
    pass


def fetch_data(phases: list[dict], recipe_phases: list[dict], folder: Path, tries: int = 3) -> list[dict]:
    """The recipe's phases, each one's data the file fetched for it from the dashboard's read grant and checked
    against the size and sha256 recorded when it was uploaded (the spec's phase `data`). A phase without one keeps
    its path (a run launched before data sets). A file that does not match is refused at once; a failed download
    is tried again, then refused."""
    out, fetched = [dict(phase) for phase in recipe_phases], {}
    for phase in phases:
        data = phase.get("data")
        if not data:
            continue
        where = f"the data of phase {phase['index']} ({phase['name']}), {data['name']},"
        if data["sha256"] not in fetched:
            try:
                target = inside(folder, data["sha256"])
            except UnsafePath as exc:
                raise DataRefused(f"{where} has an unusable name: {exc}") from None
            for attempt in range(tries):
                try:
                    fetch_verified(data, target)
                    break
                except CheckpointMismatch as exc:
                    shutil.rmtree(target, ignore_errors=True)
                    raise DataRefused(f"{where} does not match its sha256 {data['sha256'][:12]}...: {exc}") from None
                except (OSError, httpx.HTTPError) as exc:
                    if attempt == tries - 1:
                        raise DataRefused(f"{where} could not be downloaded: {type(exc).__name__}: "
                                          f"{model_source.without_query(str(exc))}") from None
                    time.sleep(2.0 * (attempt + 1))
            fetched[data["sha256"]] = target / next(iter(data["manifest"]))
        out[phase["index"]]["data"] = str(fetched[data["sha256"]])
    return out


def fetch_model(api: Api, grant: dict | None, model: dict, root: Path) -> dict:
    """The recipe's model section, its path this box's copy of the weights: a hub id or s3:// model (the spec's
    `model` grant) downloaded into `root` once per box (training/model_source.py; a killed download continues). A
    model built from a config or read from a folder is left as it is. HF_TOKEN, if this box's environment has one,
    opens a gated or private hub model; it is never logged or reported."""
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


def download(url: str, dest: Path, *, limit: int) -> None:
    """Streams one file; more bytes than the manifest says is a mismatch, found without filling the disk."""
    written = 0
    with httpx.Client(timeout=120) as http, http.stream("GET", url) as response:
        response.raise_for_status()
        with open(dest, "wb") as f:
            for chunk in response.iter_bytes():
                written += len(chunk)
                if written > limit:
                    raise CheckpointMismatch(f"{dest.name} is larger than its manifest says")
                f.write(chunk)


def file_digest(path: Path) -> tuple[int, str]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


def manifest_of(folder: Path) -> dict[str, dict]:
    """{name: {size, sha256}} of a checkpoint folder, its marker left out: what the dashboard records."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)
    manifest = {}
    for path in files:
        size, digest = file_digest(path)
        manifest[path.relative_to(folder).as_posix()] = {"size": size, "sha256": digest}
    return manifest


class Uploader(threading.Thread):
    """Uploads complete checkpoints, files first and the marker last, then tells the dashboard.

    A checkpoint is snapshotted with hard links the moment it is offered, so the trainer pruning its own store
    cannot pull files from under an upload. For a resume only the newest matters: one offered while another is
    uploading replaces any that is still waiting, so a slow uplink skips checkpoints instead of falling behind. A
    phase's final checkpoint (`protected`: it holds that phase's adapter, an output of the run) is never skipped, and a
    failed upload of one is tried again.
    """

    ATTEMPTS = 3

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
        for attempt in range(1, attempts + 1):
            try:
                return self._upload(folder)
            except Exception:  # noqa: BLE001 - said by the caller after the last attempt
                if attempt == attempts:
                    raise
                time.sleep(min(30.0, 2.0 * attempt))

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
    if not store.exists():
        return []
    found = [p for p in store.iterdir() if p.is_dir() and parse_name(p.name) and (p / MARKER).exists()]
    return sorted(found, key=lambda p: parse_name(p.name))


def stop_machine() -> None:
    """Stops this machine from inside, so that only its disk bills: FLEET_SELF_STOP if set, else the provider's API
    with the key it gives each machine, which can stop only that machine: vast.ai's CONTAINER_ID/CONTAINER_API_KEY,
    RunPod's RUNPOD_POD_ID/RUNPOD_API_KEY. A refusal or a dead API is logged: the trainer is stopped either way."""
    command = os.environ.get("FLEET_SELF_STOP", "")
    try:
        if command:
            log.warning("stopping this machine: %s", command)
            subprocess.run(command, shell=True, timeout=120)
        elif os.environ.get("CONTAINER_ID") and os.environ.get("CONTAINER_API_KEY"):
            _stop_vast(os.environ["CONTAINER_ID"], os.environ["CONTAINER_API_KEY"])
        elif os.environ.get("RUNPOD_POD_ID") and os.environ.get("RUNPOD_API_KEY"):
            _stop_runpod(os.environ["RUNPOD_POD_ID"], os.environ["RUNPOD_API_KEY"])
        else:
            log.warning("no FLEET_SELF_STOP and no machine key: the trainer is stopped, the machine is not")
    except (httpx.HTTPError, subprocess.SubprocessError, OSError) as exc:
        log.warning("stopping this machine failed: %s", exc)


def _stop_vast(instance: str, key: str) -> None:
    api = os.environ.get("FLEET_VAST_API_URL", "https://console.vast.ai/api/v0").rstrip("/")
    log.warning("stopping vast.ai instance %s", instance)
    response = httpx.put(f"{api}/instances/{instance}/", json={"state": "stopped"},
                         headers={"Authorization": f"Bearer {key}"}, timeout=30)
    if response.status_code >= 400:
        log.warning("the stop was refused: HTTP %s", response.status_code)


def _stop_runpod(pod: str, key: str) -> None:
    api = os.environ.get("FLEET_RUNPOD_API_URL", "https://api.runpod.io/graphql")
    log.warning("stopping RunPod pod %s", pod)
    response = httpx.post(api, json={"query": "mutation Stop($input: PodStopInput!) { podStop(input: $input) { id } }",
                                     "variables": {"input": {"podId": pod}}},
                          headers={"Authorization": f"Bearer {key}"}, timeout=30)
    answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    if response.status_code >= 400 or answer.get("errors"):
        log.warning("the stop was refused: HTTP %s %s", response.status_code, str(answer.get("errors"))[:300])


class Heartbeat(threading.Thread):
    """Heartbeats from start to end, through the install and the probe too: a box that goes quiet is taken for
    lost. Each answer renews the credentials; `stop` is set when the dashboard says stop, and `self_stop` too (the
    machine stops itself once the trainer is down) when it says stop_machine, when this box's token is refused, or
    when the dead-man window passes without a renewal. Nothing an answer holds can end the thread."""

    def __init__(self, api: Api, interval_s: float, window_s: float):
        super().__init__(name="heartbeat", daemon=True)
        self.api, self.interval_s, self.window_s = api, interval_s, window_s
        self.status: dict = {"state": "installing"}
        # Storage grants expire (presigned URLs): each answer brings a fresh one, handed to whoever uploads.
        self.on_upload_grant = lambda grant: None
        self.stop = threading.Event()
        self.stop_reason = ""
        self.self_stop = False
        self._done = threading.Event()
        self._renewed_at = time.monotonic()

    def run(self):
        while not self._done.is_set():
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - the dead-man switch lives in this thread: it must outlive any bug
                log.exception("heartbeat round failed")
                self._check_window()
            self._done.wait(self.interval_s)

    def beat(self):
        try:
            answer = self.api.call("POST", "heartbeat", {**self.status, **gpu_status()})
        except Refused as exc:
            if exc.status in (401, 403):  # revoked: the run ended, or another box replaced this one
                self._halt(f"the dashboard no longer accepts this box ({exc.status})", self_stop=True)
            log.warning("heartbeat refused: %s", exc)
            self._check_window()
            return
        except ConnectionError as exc:
            log.warning("heartbeat failed: %s", exc)
            self._check_window()
            return
        if not isinstance(answer, dict):
            log.warning("heartbeat answer is not an object: %r", str(answer)[:200])
            self._check_window()
            return
        self._renewed_at = time.monotonic()
        if isinstance(answer.get("upload"), dict):
            self.on_upload_grant(answer["upload"])
        command, reason = answer.get("command"), str(answer.get("reason") or "")[:300]
        if command == "stop":
            self._halt(f"the dashboard said stop{': ' + reason if reason else ''}", self_stop=False)
        elif command == "stop_machine":
            self._halt(f"the dashboard said stop this machine{': ' + reason if reason else ''}", self_stop=True)
        elif command != "continue":
            log.warning("heartbeat answer without a known command: %r", str(command)[:100])

    def _check_window(self):
        if time.monotonic() - self._renewed_at > self.window_s:
            self._halt(f"credentials not renewed for {self.window_s:.0f} s (dead-man switch)", self_stop=True)

    def _halt(self, reason: str, *, self_stop: bool):
        if self_stop:
            self.self_stop = True
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def finish(self):
        self._done.set()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(message)s")
    api = Api(os.environ["FLEET_API_URL"], os.environ["FLEET_AGENT_TOKEN"])
    workdir = Path(os.environ.get("FLEET_WORKDIR", "fleet-run")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    python = os.environ.get("FLEET_PYTHON", sys.executable)
    heartbeat = Heartbeat(api, float(os.environ.get("FLEET_HEARTBEAT_S", "5")),
                          float(os.environ.get("FLEET_DEAD_MAN_S", str(3 * 3600))))
    heartbeat.start()
    try:
        return run(api, heartbeat, workdir, python)
    finally:
        heartbeat.finish()


def run(api: Api, heartbeat: Heartbeat, workdir: Path, python: str) -> int:
    ok, output = probe(python)
    if not ok:
        api.call("POST", "events", {"kind": "probe_failed", "message": f"No probe sentinel. {output}"[-4000:]})
        return 1
    api.call("POST", "events", {"kind": "probe_ok", "message": output.strip().splitlines()[-1][:500]})

    spec = api.call("GET", "spec")
    heartbeat.interval_s, heartbeat.window_s = spec["heartbeat_interval_s"], spec["dead_man_window_s"]
    store, staging, metrics_path = workdir / "store", workdir / "staging", workdir / "metrics.jsonl"
    recipe = {**spec["recipe"], "metrics": {"jsonl": str(metrics_path)},
              "checkpoint": {**spec["recipe"].get("checkpoint", {}), "store": str(store), "staging": str(staging),
                             "endpoint_url": None, "region": None}}
    store.mkdir(parents=True, exist_ok=True)
    try:
        restore(api, spec.get("resume") or [], store)
    except RestoreFailed as exc:
        # The box exits without training: its heartbeat stops, the dashboard takes it for lost and rents another,
        # which is offered the same checkpoint.
        message = f"{exc} It is kept for the box that replaces this one; this box stops."
        api.call("POST", "events", {"kind": "log", "message": message[:4000]})
        return 7
    try:
        recipe["phases"] = fetch_data(spec["phases"], recipe.get("phases") or [], workdir / "data")
    except DataRefused as exc:
        api.call("POST", "events", {"kind": "trainer_failed", "message": f"Nothing was trained: {exc}"[:4000]})
        return 5
    try:
        recipe["model"] = fetch_model(api, spec.get("model"), recipe.get("model") or {}, workdir / "model")
    except model_source.ModelRefused as exc:
        api.call("POST", "events", {"kind": "trainer_failed", "message": f"Nothing was trained: {exc}"[:4000]})
        return 6
    recipe_path = workdir / "recipe.json"
    recipe_path.write_text(json.dumps(recipe))

    metrics = MetricsForwarder(api, metrics_path, spec["max_metric_points"])
    finals = frozenset(checkpoint_name(p["index"], p["steps"]) for p in spec["phases"])
    uploader = Uploader(api, spec["upload"], workdir / "outbox", before_complete=metrics.flush, protected=finals)
    uploader.offered.update(p.name for p in complete_checkpoints(store))  # already in the bucket
    heartbeat.on_upload_grant = uploader.renew
    uploader.start()
    with open(workdir / "trainer.log", "ab") as trainer_log:
        # The trainer stays in the agent's process group: whatever takes the agent down (a dead host, a kill of
        # the group) takes the trainer with it, and a frozen host freezes both.
        from training.distributed import command  # torch: only once the install is proven

        trainer = subprocess.Popen(command(recipe_path, int(recipe.get("gpus") or 1), python),
                                   stdout=trainer_log, stderr=subprocess.STDOUT)
        return watch(api, trainer, uploader, metrics, heartbeat, store, workdir)


def watch(api: Api, trainer: subprocess.Popen, uploader: Uploader, metrics: MetricsForwarder,
          heartbeat: Heartbeat, store: Path, workdir: Path) -> int:
    """While the trainer runs: forward its metrics, hand complete checkpoints to the uploader, keep the heartbeat's
    status current, and stop the trainer (it checkpoints on SIGTERM) when told to."""
    while True:
        metrics.flush()
        for folder in complete_checkpoints(store):
            uploader.offer(folder)
        alive = trainer.poll() is None
        heartbeat.status = {"state": "training" if alive else "uploading", "process_alive": alive,
                            "upload_queue": uploader.pending()}
        if alive and heartbeat.stop.is_set():
            log.warning("stopping the trainer: %s", heartbeat.stop_reason)
            trainer.send_signal(signal.SIGTERM)
            trainer.wait(timeout=600)
            alive = False
        if not alive:
            break
        heartbeat.stop.wait(heartbeat.interval_s)

    metrics.flush()
    for folder in complete_checkpoints(store):
        uploader.offer(folder)
    uploader.close()
    if heartbeat.self_stop:
        log.warning("stopping this machine: %s", heartbeat.stop_reason)
        stop_machine()
        return 4
    if heartbeat.stop.is_set():
        return 0
    if trainer.returncode == 0:
        api.call("POST", "events", {"kind": "finished", "message": "The trainer finished every phase."})
        return 0
    tail = (workdir / "trainer.log").read_bytes()[-3000:].decode(errors="replace")
    api.call("POST", "events", {"kind": "trainer_failed",
                                "message": f"The trainer exited with {trainer.returncode}: {tail}"[-4000:]})
    return 3


class MetricsForwarder:
    """Forwards the trainer's JSONL from where it left off; the watch loop and the uploader both call it."""

    def __init__(self, api: Api, path: Path, max_points: int):
        self.api, self.path, self.max_points = api, path, max_points
        self.position = 0
        self._lock = threading.Lock()

    def flush(self) -> None:
        with self._lock:
            self.position = forward_metrics(self.api, self.path, self.position, self.max_points)


def forward_metrics(api: Api, path: Path, position: int, max_points: int) -> int:
    """Sends the trainer's new JSONL lines in batches; returns how far the file has been read."""
    if not path.exists():
        return position
    with open(path, "rb") as f:
        f.seek(position)
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]  # a half-written last line waits for the next round
    points = [to_point(json.loads(line)) for line in complete.splitlines() if line.strip()]
    for start in range(0, len(points), max_points):
        api.call("POST", "metrics", {"points": points[start:start + max_points]})
    return position + len(complete)


if __name__ == "__main__":
    sys.exit(main())
