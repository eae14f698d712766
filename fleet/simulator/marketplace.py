"""`SimulatedMarketplace`: the market plus its HTTP server on a background thread, for tests and the launcher."""

import threading

from .hooks import InstanceHooks
from .market import Market, Settings
from .server import API, CONTROL, SimulatorServer

TICK_S = 0.2  # real seconds between passes that fire due events (boot finished, host died) without a request


class SimulatedMarketplace:
    """A local vast.ai. `with SimulatedMarketplace(api_key="k", speed=0) as sim: httpx.get(sim.base_url + ...)`.

    The direct methods (advance, inject_faults, kill_host, ...) do what the control API under /_sim does.
    """

    def __init__(self, api_key: str, seed: int = 7, speed: float = 1.0, boot_delay_s: float = 90.0,
                 host: str = "127.0.0.1", port: int = 0, *, offer_count: int = 300, search_limit_per_min: int = 600,
                 charges_min_interval_s: float = 1.0, dead_listed_s: float = 600.0, control_token: str | None = None,
                 hooks: InstanceHooks | None = None, loopback_boxes: bool = False, state_file: str = ""):
        if not api_key:
            raise ValueError("the simulated marketplace needs an API key")
        self.api_key = api_key
        self.control_token = control_token
        self.host = host
        self.port = port
        self.market = Market(
            Settings(seed=seed, speed=speed, boot_delay_s=boot_delay_s, offer_count=offer_count,
                     search_limit_per_min=search_limit_per_min, charges_min_interval_s=charges_min_interval_s,
                     dead_listed_s=dead_listed_s, loopback_boxes=loopback_boxes, state_file=state_file),
            hooks,
        )
        self._server: SimulatorServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    def start(self) -> "SimulatedMarketplace":
        if self._server is not None:
            raise RuntimeError("already started")
        self._server = SimulatorServer((self.host, self.port), self.market, self.api_key, self.control_token)
        self.port = self._server.server_address[1]
        self.market.hooks.on_listening(self.base_url)
        self._stopping.clear()
        self._threads = [
            threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                             name="simulator-http", daemon=True),
            threading.Thread(target=self._tick, name="simulator-clock", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> "SimulatedMarketplace":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What a vast.ai client takes as its base: "http://127.0.0.1:PORT/api/v0"."""
        return self.origin + API

    @property
    def control_url(self) -> str:
        return self.origin + CONTROL

    # --- the control API, in Python ---

    def advance(self, seconds: float) -> float:
        return self.market.advance(seconds)

    def inject_faults(self, **faults) -> dict:
        return self.market.inject_faults(**faults)

    def kill_host(self, instance_id: int, vanish_after_s: float | None = None) -> None:
        self.market.kill_host(instance_id, vanish_after_s)

    def hang_host(self, instance_id: int) -> None:
        self.market.hang_host(instance_id)

    def reclaim(self, instance_id: int) -> None:
        self.market.reclaim(instance_id)

    def set_uplink(self, instance_id: int, mbps: float) -> None:
        self.market.set_uplink(instance_id, mbps)

    def report_traffic(self, instance_id: int, upload_gb: float = 0.0, download_gb: float = 0.0) -> None:
        self.market.report_traffic(instance_id, upload_gb, download_gb)

    def reset(self) -> None:
        self.market.reset()

    def state(self) -> dict:
        return self.market.state()

    def offers(self) -> list[dict]:
        return self.market.offers()

    def _tick(self) -> None:
        while not self._stopping.wait(TICK_S):
            self.market.tick()
