"""Recovery from a dead host on the simulated marketplace: seconds from the host's death to the supervisor noticing,
and to the first training step on the new host.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet python bench/recovery.py [--smoke]

Everything is real but the marketplace: the dashboard serves the agent API with gunicorn, the simulated boxes run
the real agent and trainer (tiny model, CPU) as processes, and the instance sync and the supervisor run at the
product's own beat intervals (INSTANCE_SYNC_SECONDS, SUPERVISOR_SECONDS), with the default heartbeat timeout and a
30 s boot. The host is killed mid-phase. The last line is JSON; the goal is noticed <= 60 s. --smoke: a 1 s boot,
40-step phases, and the product's shortest sensible beat (sync and supervisor every 2 s, a 15 s heartbeat timeout): a
check that the benchmark runs, not the figure.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import support

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--smoke", action="store_true", help="a 1 s boot, short phases, a fast beat")
SMOKE = parser.parse_args().smoke
support.setup_django("recovery", **(dict(INSTANCE_SYNC_SECONDS="2", SUPERVISOR_SECONDS="2",
                                         AGENT_HEARTBEAT_TIMEOUT_S="15", RENT_OUTCOME_GRACE_S="5",
                                         DESTROY_VERIFY_S="5") if SMOKE else {}))

import httpx  # noqa: E402
from django.conf import settings  # noqa: E402

from fleet import actions  # noqa: E402
from fleet.offers.refresh import refresh_offers  # noqa: E402
from fleet.simulator import SimulatedMarketplace  # noqa: E402
from fleet.simulator.agents import AgentProcesses  # noqa: E402
from runs import supervisor  # noqa: E402
from runs.launch import example_recipe, launch  # noqa: E402

KEY = "bench-key"
STEPS = 40 if SMOKE else 400  # a phase: long enough that the host dies mid-phase
BOOT_DELAY_S = 1 if SMOKE else 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def measure(dashboard_url: str) -> dict:
    data_dir = Path(os.environ["DATA_DIR"])
    agents = AgentProcesses(data_dir / "boxes")
    market = SimulatedMarketplace(api_key=KEY, seed=7, speed=1.0, boot_delay_s=BOOT_DELAY_S, port=0,
                                 hooks=agents).start()
    try:
        settings.VAST_API_URL, settings.VAST_API_KEY, settings.DASHBOARD_URL = market.base_url, KEY, dashboard_url
        settings.LOCAL_BUCKETS = True  # the simulated boxes run on this machine, beside the bucket
        refresh_offers()
        recipe = example_recipe()
        recipe["phases"] = [dict(phase, steps=STEPS) for phase in recipe["phases"]]
        run = launch(name="recovery-bench", recipe=recipe, budget_usd=Decimal(50), max_restarts=3,
                     bucket=str(data_dir / "bucket"))
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
        return {"noticed_s": round(noticed_at - killed_at, 1), "first_step_s": round(stepped_at - killed_at, 1),
                "resumed_phase": resumed.phase, "resumed_step": resumed.step}
    finally:
        agents.stop_all()
        market.stop()


def main() -> None:
    with support.throwaway_database("bench_recovery") as database_url:
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind",
                                   f"127.0.0.1:{port}", "--workers", "2", "--log-level", "warning"],
                                  cwd=support.ROOT, env={**os.environ, "DATABASE_URL": database_url})
        try:
            for _ in range(100):
                try:
                    httpx.get(f"http://127.0.0.1:{port}/api/agent/v1/openapi.json", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.2)
            result = measure(f"http://127.0.0.1:{port}")
        finally:
            server.terminate()
            server.wait(10)
    print(f"host killed; noticed after {result['noticed_s']} s (sync every {settings.INSTANCE_SYNC_SECONDS} s, "
          f"supervisor every {settings.SUPERVISOR_SECONDS} s, heartbeat timeout {settings.AGENT_HEARTBEAT_TIMEOUT_S}"
          f" s); first step on the new host after {result['first_step_s']} s ({BOOT_DELAY_S} s boot), resuming at "
          f"phase {result['resumed_phase']} step {result['resumed_step']}")
    print(json.dumps({**result, "goal_noticed_s": 60, "boot_delay_s": BOOT_DELAY_S}))


if __name__ == "__main__":
    main()
