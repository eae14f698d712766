"""What nvidia-smi says of the box's GPUs, for the heartbeat."""

import shutil
import subprocess


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
    status: dict[str, float | bool] = {"gpu_ok": True}
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
