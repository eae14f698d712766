"""Recovery from a dead host on the simulated marketplace: seconds from the host's death to the supervisor noticing,
and to the first training step on the new host.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet python bench/recovery.py

Everything is real but the marketplace: the dashboard serves the agent API with gunicorn, the simulated boxes run
the real agent and trainer (tiny model, CPU) as processes, and the instance sync and the supervisor run at the
product's own beat intervals (INSTANCE_SYNC_SECONDS, SUPERVISOR_SECONDS), with the default heartbeat timeout and a
30 s boot. The host is killed mid-phase. The last line is JSON; the goal is noticed <= 60 s.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 40)
os.environ.setdefault("LOG_LEVEL", "WARNING")
os.environ["DATA_DIR"] = tempfile.mkdtemp(prefix="recovery-bench-")
os.environ.pop("REDIS_URL", None)
if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
    sys.exit("Set DATABASE_URL to a PostgreSQL server (the bench makes its own database there).")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import yaml  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

from fleet import actions  # noqa: E402
from fleet.offers import refresh_offers  # noqa: E402
from fleet.simulator import SimulatedMarketplace  # noqa: E402
from fleet.simulator.agents import AgentProcesses  # noqa: E402
from runs import supervisor  # noqa: E402
from runs.launch import launch  # noqa: E402
from runs.models import Run  # noqa: E402

EXAMPLES = ROOT / "training" / "examples"
KEY = "bench-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_recipe(steps: int) -> dict:
    recipe = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    for phase in recipe["phases"]:
        phase["data"], phase["steps"] = str(EXAMPLES / phase["data"]), steps
    recipe.pop("metrics", None)
    recipe["checkpoint"] = {"every": 5, "keep": 3}
    return recipe


class Beat:
    """The product's beat schedule for the two tasks that matter here, at their configured intervals."""

    def __init__(self):
        self.next_sync = self.next_supervise = 0.0

    def tick(self):
        now = time.monotonic()
        if now >= self.next_sync:
            actions.sync()
            self.next_sync = now + settings.INSTANCE_SYNC_SECONDS
        if now >= self.next_supervise:
            supervisor.supervise()
            self.next_supervise = now + settings.SUPERVISOR_SECONDS


def main() -> None:
    setup_test_environment()
    connection.settings_dict["TEST"]["NAME"] = "bench_recovery"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/bench_recovery"}
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind",
                               f"127.0.0.1:{port}", "--workers", "2", "--log-level", "warning"], cwd=ROOT, env=env)
    agents = AgentProcesses(Path(os.environ["DATA_DIR"]) / "boxes")
    market = SimulatedMarketplace(api_key=KEY, seed=7, speed=1.0, boot_delay_s=30, port=0, hooks=agents).start()
    try:
        settings.VAST_API_URL, settings.VAST_API_KEY = market.base_url, KEY
        settings.DASHBOARD_URL = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(settings.DASHBOARD_URL + "/api/agent/v1/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        refresh_offers()
        run = launch(name="recovery-bench", recipe=tiny_recipe(steps=400), budget_usd=Decimal(50), max_restarts=3,
                     bucket=str(Path(os.environ["DATA_DIR"]) / "bucket"))
        beat = Beat()

        def wait(until, limit_s):
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline:
                beat.tick()
                run.refresh_from_db()
                if until(run):
                    return time.monotonic()
                time.sleep(0.2)
            raise SystemExit(f"gave up waiting: run {run.state} at phase {run.current_phase} step {run.current_step}")

        wait(lambda r: r.state == "training" and r.current_phase >= 1, 600)
        first_box = run.current_instance
        market.kill_host(int(first_box.provider_instance_id))
        killed_at = time.monotonic()
        noticed_at = wait(lambda r: r.events.filter(kind="host_lost").exists(), 600)
        stepped_at = wait(lambda r: r.current_instance_id not in (None, first_box.pk)
                          and r.metrics.filter(instance_id=r.current_instance_id).exists(), 900)
        resumed = run.metrics.filter(instance_id=run.current_instance_id).order_by("phase", "step").first()
    finally:
        agents.stop_all()
        market.stop()
        server.terminate()
        server.wait(10)
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)
    noticed, first_step = noticed_at - killed_at, stepped_at - killed_at
    print(f"host killed; noticed after {noticed:.1f} s (sync every {settings.INSTANCE_SYNC_SECONDS} s, supervisor "
          f"every {settings.SUPERVISOR_SECONDS} s, heartbeat timeout {settings.AGENT_HEARTBEAT_TIMEOUT_S} s); first "
          f"step on the new host after {first_step:.1f} s (30 s boot), resuming at phase {resumed.phase} step "
          f"{resumed.step}")
    print(json.dumps({"noticed_s": round(noticed, 1), "first_step_s": round(first_step, 1), "goal_noticed_s": 60,
                      "boot_delay_s": 30, "resumed_phase": resumed.phase, "resumed_step": resumed.step}))


if __name__ == "__main__":
    main()
