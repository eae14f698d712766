"""Plain records that every provider client returns.

Marketplace JSON is converted into these exactly once, in the client, so every unit is in a field's name and no
code past the client ever sees a provider's own field names or units (vast.ai's gpu_ram is MB, compute_cap is
x100, bandwidth is Mb/s, storage is $/GB/month).
"""

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OfferRecord:
    provider: str
    offer_id: str
    machine_id: str
    host_id: str
    gpu_name: str
    num_gpus: int
    gpu_ram_gb: float  # per GPU
    compute_capability: int  # x10 like CUDA's sm numbers: 90 for sm_90, 120 for sm_120
    cuda_max: float  # the newest CUDA version the host's driver runs, e.g. 12.8
    driver_version: str  # "570.124.06"; "" when the listing has none
    disk_gb: float
    inet_up_mbps: float
    inet_down_mbps: float
    inet_up_usd_per_gb: Decimal
    inet_down_usd_per_gb: Decimal
    storage_usd_per_gb_month: Decimal
    gpu_usd_per_hour: Decimal  # the machine alone (vast.ai dph_base)
    total_usd_per_hour: Decimal  # machine plus the offered disk (vast.ai dph_total)
    min_bid_usd_per_hour: Decimal | None
    reliability: float  # 0..1
    verified: bool
    rentable: bool
    is_bid: bool  # listed for interruptible (bid) rental
    geolocation: str  # "Sweden, SE", "US-CA, US"
    dlperf: float | None
    total_flops: float | None  # TFLOPS, all GPUs together
    # Between the GPUs of one box, as the listing says (vast.ai bw_nvlink, pcie_bw); None where it says nothing.
    # nvlink_gb_s 0: no NVLink, the GPUs talk over PCIe.
    nvlink_gb_s: float | None = None
    pcie_gb_s: float | None = None
    # The host, as vast.ai's search documents it: a datacenter (hosting_type 1) or not, and each GPU's memory
    # bandwidth (gpu_mem_bw, GB/s); None where the listing says nothing.
    datacenter: bool | None = None
    gpu_mem_bw_gb_s: float | None = None
    # The host memory the rental gets (vast.ai cpu_ram), GiB as gpu_ram_gb is; None where the listing says nothing.
    cpu_ram_gb: float | None = None


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    provider: str
    instance_id: str
    label: str
    status: str  # the provider's own status word (vast.ai actual_status)
    status_msg: str
    intended_status: str
    is_bid: bool
    gpu_name: str
    num_gpus: int
    machine_id: str
    usd_per_hour: Decimal | None  # None: the provider gave no price we could read (never taken as free)
    gpu_util_percent: float | None
    public_ip: str
    ports: dict[str, int]  # container port -> public port, e.g. {"8000/tcp": 41234}
    ssh_host: str
    ssh_port: int | None
    started_at: datetime | None
    problems: tuple[str, ...] = ()  # fields of the listing that could not be read, left at their unknown values
    # What the machine bills per hour in its current state, where the provider bills less than usd_per_hour in some
    # (vast.ai: storage only until "running", and while stopped); None: usd_per_hour.
    billing_usd_per_hour: Decimal | None = None
    min_bid_usd_per_hour: Decimal | None = None  # an interruptible machine's bid to beat now (vast.ai min_bid)

    @property
    def outbid(self) -> bool:
        """An interruptible machine stopped by a higher bid: the user still wants it running (vast.ai lists it
        stopped, intended running)."""
        return self.is_bid and self.status == "stopped" and self.intended_status == "running"

    @property
    def failed_to_start(self) -> bool:
        # vast.ai leaves an instance whose container could not start in "created" with the runtime's error text.
        return self.status == "created" and "OCI runtime create failed" in self.status_msg


@dataclass(frozen=True, slots=True)
class ChargeRecord:
    provider: str
    instance_id: str
    kind: str  # "gpu", "disk", "bwu" (upload), "bwd" (download)
    amount_usd: Decimal
    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True)
class VolumeRecord:
    """A volume of the account, where a model is kept between boxes: a vast.ai volume lives on one machine (a box that
    mounts it must be rented on that machine), a RunPod network volume in one data centre (its pods run there)."""

    provider: str
    volume_id: str
    name: str
    size_gb: float
    status: str  # the provider's word; RunPod lists no status (a listed network volume is usable): "ready"
    usable: bool  # whether a box may mount it now
    machine_id: str = ""  # vast.ai: the machine it lives on
    data_center_id: str = ""  # RunPod: the data centre it lives in
    geolocation: str = ""
    storage_usd_per_gb_month: Decimal | None = None  # what it bills per GB and month, where the provider says


@dataclass(frozen=True, slots=True)
class VolumeMount:
    """A volume a rent mounts in the box at `mount_path` (vast.ai links it by id, RunPod as networkVolumeId)."""

    volume_id: str
    mount_path: str
    data_center_id: str = ""  # RunPod: the volume's data centre, where the pod must be deployed


@dataclass(frozen=True, slots=True)
class RentRequest:
    offer_id: str
    image: str
    disk_gb: int
    label: str
    env: dict[str, str]
    onstart: str = ""
    bid_usd_per_hour: Decimal | None = None  # set: an interruptible rental at this price
    volume: VolumeMount | None = None  # set: the box mounts this volume of the account


def readable(raws: Iterable, parse: Callable[[Any], T], what: str) -> list[T]:
    """Each listed item parsed; one that cannot be read is logged with `what` it is and left out."""
    parsed = []
    for raw in raws:
        try:
            parsed.append(parse(raw))
        except (TypeError, ValueError) as exc:
            log.warning("%s that cannot be read: %s", what, exc)
    return parsed
