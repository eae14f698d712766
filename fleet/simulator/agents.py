"""Simulated boxes that run the real thing: when a simulated instance boots, the command it was rented with (the
on-box agent, `python -m training.agent`) starts as a local process with the instance's environment, in a folder of
its own (its "local disk"). The marketplace's faults act on that process: a dead host kills it and loses its
folder, a hung host freezes it (SIGSTOP: alive to a process check, making no progress), a destroy kills it.
"""

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from .hooks import InstanceHooks

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 64 * 1024  # what `vastai logs` gets of the agent's output at most


class AgentProcesses(InstanceHooks):
    def __init__(self, workdir: str | Path, python: str = sys.executable, extra_env: dict | None = None):
        self.workdir = Path(workdir)
        self.python = python
        self.extra_env = dict(extra_env or {})
        self.processes: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def folder(self, instance_id: int) -> Path:
        return self.workdir / f"instance-{instance_id}"

    def on_running(self, instance: dict) -> None:
        command = (instance.get("onstart") or "").strip()
        if not command or instance.get("cuda_init_error"):
            return  # nothing to run, or CUDA cannot start on this host: the box just sits there (and bills)
        with self._lock:
            if instance["id"] in self.processes:
                return
            folder = self.folder(instance["id"])
            folder.mkdir(parents=True, exist_ok=True)
            argv = shlex.split(command)
            if argv[0] in ("python", "python3"):
                argv[0] = self.python
            env = {**os.environ, **self.extra_env, **{k: str(v) for k, v in (instance.get("env") or {}).items()},
                   "FLEET_WORKDIR": str(folder / "work"), "CONTAINER_ID": str(instance["id"])}
            with open(folder / "agent.log", "ab") as out:
                self.processes[instance["id"]] = subprocess.Popen(
                    argv, env=env, cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        log.info("simulated instance %s runs %s", instance["id"], command)

    def logs(self, instance_id: int) -> str:
        try:
            with open(self.folder(instance_id) / "agent.log", "rb") as log_file:
                log_file.seek(0, os.SEEK_END)
                log_file.seek(max(0, log_file.tell() - LOG_TAIL_BYTES))
                return log_file.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def on_hung(self, instance: dict) -> None:
        self._signal(instance["id"], signal.SIGSTOP)

    def on_host_died(self, instance: dict) -> None:
        self._kill(instance["id"])
        shutil.rmtree(self.folder(instance["id"]), ignore_errors=True)  # its local disk went with it

    def on_stopped(self, instance: dict) -> None:
        self._kill(instance["id"])

    def on_destroyed(self, instance: dict) -> None:
        self._kill(instance["id"])

    def _signal(self, instance_id: int, signum: int) -> None:
        process = self.processes.get(instance_id)
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                pass

    def _kill(self, instance_id: int) -> None:
        with self._lock:
            process = self.processes.pop(instance_id, None)
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)

    def stop_all(self) -> None:
        for instance_id in list(self.processes):
            self._kill(instance_id)
