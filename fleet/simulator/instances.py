"""A rented machine and how it looks through vast.ai's API at a given simulated time, its status derived from its
timestamps (docs/fleet.md, "fleet/simulator/instances.py")."""

import re
from dataclasses import dataclass, field
from itertools import pairwise

from .catalogue import HOURS_PER_MONTH, MAX_RENTAL_S, Offer

CREATED_SHARE = 0.1  # the first tenth of the boot delay shows "created", the rest "loading" (pulling the image)

CUDA_803 = (
    "Error response from container: CUDA error 803: system has unsupported display driver / cuda driver "
    "combination (cudaErrorSystemDriverMismatch)"
)
_IMAGE_CUDA = re.compile(r"cuda[-_:]?v?(\d{2})\.(\d)", re.IGNORECASE)
_IMAGE_CU = re.compile(r"(?<![a-z])cu(\d{2})(\d)(?!\d)", re.IGNORECASE)


def image_cuda_version(image: str) -> float | None:
    """The CUDA version an image tag names ("...-cuda12.8-...", "nvidia/cuda:13.0.1-...", "...-cu128"), if any."""
    found = _IMAGE_CUDA.search(image) or _IMAGE_CU.search(image)
    return float(f"{int(found.group(1))}.{found.group(2)}") if found else None


def extra_env(env) -> list[list[str]]:
    """The rented environment's variables as [name, value] pairs, without docker's `-p`/`-v` options."""
    if isinstance(env, str):
        words = env.split()
        pairs = [w.split("=", 1) for flag, w in pairwise(words) if flag == "-e" and "=" in w]
    else:
        pairs = [[str(k), str(v)] for k, v in (env or {}).items() if not str(k).startswith("-")]
    return [list(pair) for pair in pairs]


@dataclass
class Instance:
    id: int
    offer: Offer
    image: str
    env: object
    onstart: str
    runtype: str
    label: str
    disk_gb: float
    is_bid: bool
    gpu_usd_per_hour: float  # dph_base for on-demand, the bid for interruptible
    created_at: float
    boot_delay_s: float
    ssh_host: str
    ssh_port: int
    public_ipaddr: str
    ports: dict
    busy_gpu_util: float  # what gpu_util shows while it runs normally
    boot_started_at: float
    gpu_billed_since: float | None  # open GPU billing interval; None while stopped, dead or destroyed
    gpu_intervals: list = field(default_factory=list)  # closed (start, end) GPU billing intervals
    # Dollars of the closed intervals, each at the price it ran at (a bid can change); None: all at today's price.
    gpu_usd_closed: float | None = None
    state: str = "active"  # active | stopped | dead | destroyed
    intended_status: str = "running"
    stop_msg: str = ""
    hung: bool = False
    cuda_init_error: str = ""
    dies_at: float | None = None
    died_at: float | None = None
    vanish_at: float | None = None
    destroyed_at: float | None = None
    announced_running: bool = False
    effective_inet_up_mbps: float = 0.0
    upload_gb: float = 0.0
    download_gb: float = 0.0
    traffic_first_at: float | None = None
    traffic_last_at: float | None = None
    log_lines: list = field(default_factory=list)  # (simulated time, text) of the container's log
    container_api_key: str = ""  # the key vast.ai gives the machine itself: it opens only this instance's stop
    volume_info: list = field(default_factory=list)  # the volumes it links: {"id", "mount_path", "total_space", ...}

    @property
    def dph_total(self) -> float:
        return self.gpu_usd_per_hour + self.offer.storage_cost * self.disk_gb / HOURS_PER_MONTH

    def listed(self, now: float) -> bool:
        """Whether the instance still exists for the API (a dead host's instance vanishes after a while)."""
        if self.state == "destroyed":
            return False
        return not (self.state == "dead" and self.vanish_at is not None and now >= self.vanish_at)

    def phase(self, now: float) -> str:
        if self.state == "dead":
            return "exited"
        if self.state == "stopped":
            return "stopped"
        booted_for = now - self.boot_started_at
        if booted_for >= self.boot_delay_s:
            return "running"
        return "created" if booted_for < self.boot_delay_s * CREATED_SHARE else "loading"

    def view(self, now: float) -> dict:
        """The instance as `GET /instances/` returns it."""
        phase = self.phase(now)
        cur_state, next_state, status_msg = {
            "created": ("running", "running", "Creating container"),
            "loading": ("running", "running", f"Pulling image {self.image}"),
            "running": ("running", "running", self.cuda_init_error or f"success, running {self.image}"),
            "stopped": ("stopped", "stopped", self.stop_msg),
            "exited": ("stopped", "stopped", self.stop_msg),
        }[phase]
        healthy = phase == "running" and not self.hung and not self.cuda_init_error
        offer = self.offer
        return {
            "id": self.id,
            "actual_status": phase,
            "cur_state": cur_state,
            "next_state": next_state,
            "intended_status": self.intended_status,
            "status_msg": status_msg,
            "label": self.label,
            "start_date": round(self.created_at, 3),
            "is_bid": self.is_bid,
            "dph_base": round(self.gpu_usd_per_hour, 4),
            "dph_total": round(self.dph_total, 4),
            "min_bid": round(offer.min_bid, 4),
            "gpu_util": self.busy_gpu_util if healthy else 0.0,
            "gpu_name": offer.gpu.name,
            "num_gpus": offer.num_gpus,
            "gpu_ram": offer.gpu.gpu_ram_mb,
            "gpu_totalram": offer.gpu.gpu_ram_mb * offer.num_gpus,
            "compute_cap": offer.gpu.compute_cap,
            "cuda_max_good": offer.cuda_max_good,
            "driver_version": offer.driver_version,
            "ssh_host": self.ssh_host,
            "ssh_port": self.ssh_port,
            "public_ipaddr": self.public_ipaddr,
            "ports": self.ports if phase == "running" else {},
            "machine_id": offer.machine_id,
            "host_id": offer.host_id,
            "geolocation": offer.geolocation,
            "reliability2": offer.reliability2,
            "inet_up": offer.inet_up,
            "inet_down": offer.inet_down,
            "inet_up_cost": offer.inet_up_cost,
            "inet_down_cost": offer.inet_down_cost,
            "storage_cost": offer.storage_cost,
            "image_uuid": self.image,
            "image_runtype": self.runtype,
            "disk_space": self.disk_gb,
            "disk_usage": round(min(self.disk_gb, 8.0 + self.download_gb), 2) if phase == "running" else 0.0,
            "disk_util": round(min(1.0, (8.0 + self.download_gb) / self.disk_gb), 4) if phase == "running" else 0.0,
            "cpu_name": offer.cpu_name,
            "cpu_cores": offer.cpu_cores,
            "cpu_cores_effective": float(offer.cpu_cores),
            "cpu_ram": offer.cpu_ram_mb,
            "cpu_util": round(self.busy_gpu_util / 10, 1) if healthy else 0.0,
            "gpu_temp": 71.0 if healthy else 35.0,
            "reliability": offer.reliability,
            "verification": "verified" if offer.verified else "unverified",
            "uptime_mins": round(max(0.0, now - self.boot_started_at) / 60, 2) if self.state == "active" else None,
            "end_date": round(self.created_at + MAX_RENTAL_S, 3),
            "template_id": None,
            "template_name": None,
            "volume_info": [dict(linked) for linked in self.volume_info],
            "env": self.env,
            "extra_env": extra_env(self.env),  # vast.ai's pairs; the official CLI turns them back into a dict
            "onstart": self.onstart,
        }

    def log_boot(self, at: float) -> None:
        """The lines a boot starting now will print as it goes (each shows once its time has come)."""
        self.log_lines.append((at, f"Creating container from {self.image}" if at == self.created_at
                               else "Starting container"))
        self.log_lines.append((at + self.boot_delay_s * CREATED_SHARE, f"Pulling image {self.image}"))
        self.log_lines.append((at + self.boot_delay_s,
                               self.cuda_init_error or f"Container started: {self.onstart or self.runtype}"))

    def log_end(self, at: float, text: str) -> None:
        """The container stopped or its host went away: what it had not printed yet never comes."""
        self.log_lines = [(t, line) for t, line in self.log_lines if t <= at] + [(at, text)]

    def container_log(self, now: float) -> list[str]:
        return [f"{at:.3f} {text}" for at, text in self.log_lines if at <= now]

    def hidden(self, now: float) -> dict:
        """What only the control API shows: faults the marketplace itself would not tell."""
        return {
            "hung": self.hung,
            "cuda_init_error": self.cuda_init_error,
            "state": self.state,
            "dies_at": self.dies_at,
            "died_at": self.died_at,
            "vanish_at": self.vanish_at,
            "destroyed_at": self.destroyed_at,
            "listed": self.listed(now),
            "effective_inet_up_mbps": self.effective_inet_up_mbps,
            "upload_gb": self.upload_gb,
            "download_gb": self.download_gb,
            "offer_id": self.offer.id,
            "container_api_key": self.container_api_key,
        }
