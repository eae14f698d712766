"""The watch loop: what the agent does while the trainer runs, and how the box's run ends."""

import logging
import signal
import subprocess
import time
from pathlib import Path

from training.trainer_exits import own_words

from .dashboard import Api
from .exit_codes import Exit
from .heartbeat import Heartbeat
from .retry import retried
from .metrics import MetricsForwarder
from .self_stop import stop_machine
from .uploads import Uploader, complete_checkpoints

log = logging.getLogger(__name__)

STOP_GRACE_S = 600  # how long the trainer has to write its checkpoint after SIGTERM
FINISH_TRIES = 12  # of 'finished', about ten minutes in all: the heartbeat goes on, so the box is not taken for lost


def watch(api: Api, trainer: subprocess.Popen, uploader: Uploader, metrics: MetricsForwarder,
          heartbeat: Heartbeat, store: Path, workdir: Path, on_trained=None) -> Exit:
    """While the trainer runs: forward its metrics, hand complete checkpoints to the uploader, keep the heartbeat's
    status current, and stop the trainer (it checkpoints on SIGTERM) when told to. Once it has trained every phase
    and each checkpoint is uploaded: `on_trained()` (the eval phase) where given, else 'finished' is said."""
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
            trainer.wait(timeout=STOP_GRACE_S)
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
        return Exit.MACHINE_STOPPED
    if heartbeat.stop.is_set():
        return Exit.OK
    if trainer.returncode == 0:
        if on_trained is not None:
            return on_trained()
        report_finished(api)
        return Exit.OK
    tail = (workdir / "trainer.log").read_bytes()[-3000:].decode(errors="replace")
    words = own_words(trainer.returncode, tail)
    api.call("POST", "events", {"kind": "trainer_failed",
                                "message": f"The trainer exited with {trainer.returncode}: {words}"[-4000:]})
    return Exit.TRAINER_FAILED


def report_finished(api: Api, *, sleep=time.sleep) -> None:
    """Tells the dashboard the trainer finished. Answered 503 while the run's final checkpoint is being sealed (copied
    where the run keeps it), it says it again for about ten minutes; the heartbeat goes on meanwhile."""
    finished = {"kind": "finished", "message": "The trainer finished every phase."}
    retried(lambda: api.call("POST", "events", finished), tries=FINISH_TRIES, first_s=5.0, cap_s=60.0,
            retry_on=(ConnectionError,), sleep=sleep)
