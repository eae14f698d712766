"""Simulated boxes that run the real thing: a booted instance's command runs as a local process that the marketplace's
faults act on (docs/fleet.md, "fleet/simulator/agents.py")."""

import json

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
SESSION_FILE = "agent.session"  # the process session a box's command runs in, for a marketplace started again


class AgentProcesses(InstanceHooks):
    def __init__(self, workdir: str | Path, python: str = sys.executable, extra_env: dict | None = None):
        self.workdir = Path(workdir)
        self.python = python
        self.extra_env = dict(extra_env or {})
        self.processes: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self.api_url = ""  # the marketplace's, once it listens: a box stops its own machine there

    def on_listening(self, api_url: str) -> None:
        self.api_url = api_url

    def shims(self) -> Path:
        """The folder whose `python3`, `python` and `vllm` a start script finds first on its PATH."""
        folder = self.workdir / "bin"
        folder.mkdir(parents=True, exist_ok=True)
        for name, target in (("python3", ""), ("python", ""), ("vllm", " -m fleet.simulator.vllm")):
            shim = folder / name
            shim.write_text(f'#!/bin/sh\nexec {shlex.quote(self.python)}{target} "$@"\n')
            shim.chmod(0o755)
        # `nvidia-smi -L` lists the GPUs the box was rented with (none of them real), as a start script counts them.
        shim = folder / "nvidia-smi"
        shim.write_text('#!/bin/sh\ni=0\nwhile [ "$i" -lt "${FLEET_SIM_NUM_GPUS:-1}" ]; do\n'
                        '  echo "GPU $i: NVIDIA Simulated (UUID: GPU-simulated-$i)"; i=$((i + 1))\ndone\n')
        shim.chmod(0o755)
        return folder

    def folder(self, instance_id: int) -> Path:
        return self.workdir / f"instance-{instance_id}"

    def volume_folder(self, volume_id: int) -> Path:
        """A volume's disk: a folder of its own, kept when the boxes that linked it are destroyed or their host dies
        (it lives on the machine, apart from any instance), removed when the volume is deleted."""
        return self.workdir / "volumes" / f"volume-{int(volume_id)}"

    def on_volume_deleted(self, volume_id: int) -> None:
        shutil.rmtree(self.volume_folder(volume_id), ignore_errors=True)

    def on_running(self, instance: dict) -> None:
        command = (instance.get("onstart") or "").strip()
        if not command or instance.get("cuda_init_error"):
            return  # nothing to run, or CUDA cannot start on this host: the box just sits there (and bills)
        with self._lock:
            if instance["id"] in self.processes:
                return
            folder = self.folder(instance["id"])
            folder.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **self.extra_env,
                   **{k: str(v) for k, v in (instance.get("env") or {}).items()},
                   "FLEET_WORKDIR": str(folder / "work"), "CONTAINER_ID": str(instance["id"]),
                   "FLEET_SIM_PORTS": json.dumps({port: mapped[0]["HostPort"]
                                                  for port, mapped in (instance.get("ports") or {}).items()})}
            if instance.get("num_gpus"):
                env["FLEET_SIM_NUM_GPUS"] = str(instance["num_gpus"])
            mounts = {}
            for linked in instance.get("volume_info") or ():  # a process cannot mount: it is told where its volume is
                mounts[linked["mount_path"]] = str(self.volume_folder(linked["id"]))
                Path(mounts[linked["mount_path"]]).mkdir(parents=True, exist_ok=True)
            if mounts:
                env["FLEET_SIM_MOUNTS"] = json.dumps(mounts)
            if self.api_url and instance.get("container_api_key"):  # as vast.ai gives each machine its own key
                env |= {"CONTAINER_API_KEY": instance["container_api_key"], "FLEET_VAST_API_URL": self.api_url}
            argv = shlex.split(command) if "\n" not in command else []
            if argv and argv[0] in ("python", "python3"):
                argv[0] = self.python
            else:
                argv = ["/bin/sh", "-c", command]
                env["PATH"] = f"{self.shims()}{os.pathsep}{env.get('PATH', '')}"
            _end_leftover(folder)
            with open(folder / "agent.log", "ab") as out:
                process = subprocess.Popen(
                    argv, env=env, cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.processes[instance["id"]] = process
            (folder / SESSION_FILE).write_text(str(process.pid))
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
        # The whole session, whether or not its first process is still alive: a start script ends once it has put
        # vLLM in the background, and vLLM is what must freeze or die with the box.
        process = self.processes.get(instance_id)
        if process is not None:
            self._signal_group(process, signum)

    def _kill(self, instance_id: int) -> None:
        with self._lock:
            process = self.processes.pop(instance_id, None)
        if process is not None:
            self._signal_group(process, signal.SIGKILL)
            process.wait(timeout=30)

    @staticmethod
    def _signal_group(process: subprocess.Popen, signum: int) -> None:
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):  # the session is gone (its id may even be someone else's now)
            pass

    def stop_all(self) -> None:
        for instance_id in list(self.processes):
            self._kill(instance_id)



def _end_leftover(folder: Path) -> None:
    """A box's command is started again after the marketplace's process ended without stopping it (killed outright):
    what is left of the last start goes first, as a restarted container's old processes do. Only a session with a
    process still working in this box's folder is ended, never one that took over its number."""
    try:
        session = int((folder / SESSION_FILE).read_text())
    except (OSError, ValueError):
        return
    members = []
    for entry in Path("/proc").glob("[0-9]*"):  # no /proc (not Linux): nothing can be told, nothing is ended
        try:
            if os.getsid(int(entry.name)) == session:
                members.append((entry / "cwd").resolve())
        except OSError:
            pass
    if any(cwd.is_relative_to(folder.resolve()) for cwd in members):
        _kill_session(session)
        log.warning("simulated box in %s: ended session %s left over from before the marketplace restarted",
                    folder, session)


def _kill_session(session: int) -> None:
    try:
        os.killpg(session, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
