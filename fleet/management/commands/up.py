"""Starts everything the product needs on one machine and supervises it: the web app (gunicorn), a Celery
worker, Celery beat and, on the embedded default, the simulated marketplace. If one of them dies, all stop, so a
half-running product never looks healthy."""

import os
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from fleet import enqueue
from fleet.providers.registry import configured_providers


def _wait_for_port(host: str, port: int, timeout_s: float, name: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise CommandError(f"The {name} exited with {process.returncode} before it listened on {port}.")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise CommandError(f"Nothing listens on {host}:{port} after {timeout_s:.0f} s.")


class Command(BaseCommand):
    help = "Start the web app, a Celery worker, Celery beat and (embedded default) the simulated marketplace."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--web-workers", type=int, default=int(os.environ.get("WEB_WORKERS", "2")))
        parser.add_argument("--worker-concurrency", type=int, default=int(os.environ.get("WORKER_CONCURRENCY", "2")))

    def handle(self, *args, host, port, web_workers, worker_concurrency, **options):
        self.processes: list[tuple[str, subprocess.Popen]] = []
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        python = sys.executable
        try:
            if settings.SIMULATOR_ENABLED:
                simulator = self._start("simulated marketplace", [
                    python, "-m", "fleet.simulator", "--host", settings.SIMULATOR_HOST,
                    "--port", str(settings.SIMULATOR_PORT), "--speed", str(settings.SIMULATOR_SPEED),
                    "--boot-delay", str(settings.SIMULATOR_BOOT_DELAY_S),
                    "--run-agents", str(settings.DATA_DIR / "simulated-boxes"),
                    "--state-file", str(settings.DATA_DIR / "simulated-marketplace.json"),
                ], env={"SIMULATOR_API_KEY": settings.SIMULATOR_API_KEY})
                _wait_for_port(settings.SIMULATOR_HOST, settings.SIMULATOR_PORT, 30, "simulated marketplace", simulator)
            self._start("worker", [python, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO",
                                   "--concurrency", str(worker_concurrency)])
            self._start("beat", [python, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO"])
            web = self._start("web", [python, "-m", "gunicorn", "config.wsgi:application", "--bind", f"{host}:{port}",
                                      "--workers", str(web_workers), "--access-logfile", "-"])
            _wait_for_port(host, port, 60, "web server", web)

            for provider in configured_providers():  # the first listing now, not one beat interval from now
                enqueue.refresh_offers(provider)
            market = "the simulated marketplace" if settings.SIMULATOR_ENABLED else settings.VAST_API_URL
            self.stdout.write(self.style.SUCCESS(
                f"The dashboard is up: open http://{host}:{port}/ and log in (offers from {market})."), ending="\n")
            self.stdout.flush()
            self._supervise()
        finally:
            self._stop_all()

    def _start(self, name: str, command: list[str], env: dict | None = None) -> subprocess.Popen:
        process = subprocess.Popen(command, env={**os.environ, **(env or {})})
        self.processes.append((name, process))
        return process

    def _supervise(self) -> None:
        while True:
            for name, process in self.processes:
                if process.poll() is not None:
                    raise CommandError(f"The {name} exited with status {process.returncode}; stopping everything.")
            time.sleep(0.5)

    def _on_signal(self, signum, frame):
        raise SystemExit(0)

    def _stop_all(self) -> None:
        for _, process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 15
        for _, process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
