"""The simulated marketplace, a real Celery worker and real Celery beat for the tests, shared by every test folder."""

import contextlib
import threading

import pytest

MARKET_KEY = "test-market-key"


@pytest.fixture(scope="session")
def _market_server():
    from fleet.simulator import SimulatedMarketplace

    server = SimulatedMarketplace(api_key=MARKET_KEY, seed=7, speed=1.0, boot_delay_s=90, port=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def market(_market_server, settings):
    """The simulated marketplace over real HTTP, fresh for each test, with the product pointed at it."""
    _market_server.reset()
    settings.VAST_API_URL = _market_server.base_url
    settings.VAST_API_KEY = MARKET_KEY
    settings.PROVIDER_MAX_RETRIES = 2
    return _market_server


@pytest.fixture
def celery_worker(transactional_db):
    """A real Celery worker consuming from the Redis broker, in a thread of this process."""
    from celery.contrib.testing.worker import start_worker

    from config.celery import app

    app.control.purge()
    with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=10):
        yield app


@contextlib.contextmanager
def running_beat(app, schedule_dir, tasks, every_s=0.5):
    """Real Celery beat in a thread, sending each of `tasks` (dotted task names) every `every_s` seconds to the
    worker of `app` (the product's own schedule sends them every 10-60 s)."""
    from celery.beat import Service

    saved, app.conf.beat_schedule = app.conf.beat_schedule, {
        task: {"task": task, "schedule": every_s} for task in tasks}
    service = Service(app, max_interval=every_s, schedule_filename=str(schedule_dir / "beat-schedule"),
                      scheduler_cls="celery.beat:PersistentScheduler")
    thread = threading.Thread(target=service.start, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        service.stop(wait=True)
        thread.join(10)
        app.conf.beat_schedule = saved


@pytest.fixture
def frozen_market(settings):
    """A marketplace whose clock moves only when the test advances it, for costs worked out by hand."""
    from fleet.simulator import SimulatedMarketplace

    with SimulatedMarketplace(api_key=MARKET_KEY, seed=7, speed=0, boot_delay_s=90, port=0,
                              charges_min_interval_s=0) as server:
        settings.VAST_API_URL = server.base_url
        settings.VAST_API_KEY = MARKET_KEY
        settings.PROVIDER_MAX_RETRIES = 2
        yield server


def sim_now(market):
    """The marketplace's clock as a datetime, so the ledger and the market bill over the same seconds."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(market.state()["clock"], tz=UTC)


@pytest.fixture
def runpod_market(settings):
    """The fake RunPod GraphQL server (tests/fleet/runpod_server.py), over HTTP, as the product's configured RunPod."""
    from tests.fleet.runpod_server import RUNPOD_KEY, FakeRunPod

    server = FakeRunPod(boot_polls=None).start()
    settings.RUNPOD_API_URL, settings.RUNPOD_API_KEY = server.base_url, RUNPOD_KEY
    yield server
    server.stop()


@contextlib.contextmanager
def boxes_reporting_to(dashboard_url, settings, folder, *, heartbeat_timeout_s, loopback_boxes=False,
                       extra_env=None):
    """The simulated marketplace over HTTP whose boxes run as local processes (the real agent, or a serving box's
    start script), with the dashboard's settings pointed at it and the boxes at `dashboard_url`: (market, boxes)."""
    from fleet.offers.refresh import refresh_offers
    from fleet.simulator import SimulatedMarketplace
    from fleet.simulator.agents import AgentProcesses

    boxes = AgentProcesses(folder, extra_env=extra_env)
    with SimulatedMarketplace(api_key=MARKET_KEY, seed=7, speed=1.0, boot_delay_s=1, port=0, charges_min_interval_s=0,
                              hooks=boxes, loopback_boxes=loopback_boxes) as market:
        settings.VAST_API_URL, settings.VAST_API_KEY = market.base_url, MARKET_KEY
        settings.DASHBOARD_URL = dashboard_url
        settings.AGENT_HEARTBEAT_TIMEOUT_S = heartbeat_timeout_s
        refresh_offers()
        try:
            yield market, boxes
        finally:
            boxes.stop_all()
