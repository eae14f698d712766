"""The watch loop: what the agent does while the trainer runs, and how the box's run ends."""

import logging
import signal
import subprocess
from pathlib import Path

from .dashboard import Api
from .exit_codes import Exit
from .heartbeat import Heartbeat
from .metrics import MetricsForwarder
from .self_stop import stop_machine
from .uploads import Uploader, complete_checkpoints

log = logging.getLogger(__name__)

STOP_GRACE_S = 600  # how long the trainer has to write its checkpoint after SIGTERM


def watch(api: Api, trainer: subprocess.Popen, uploader: Uploader, metrics: MetricsForwarder,
          heartbeat: Heartbeat, store: Path, workdir: Path) -> Exit:
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
        api.call("POST", "events", {"kind": "finished", "message": "The trainer finished every phase."})
        return Exit.OK
    tail = (workdir / "trainer.log").read_bytes()[-3000:].decode(errors="replace")
    api.call("POST", "events", {"kind": "trainer_failed",
                                "message": f"The trainer exited with {trainer.returncode}: {tail}"[-4000:]})
    return Exit.TRAINER_FAILED
