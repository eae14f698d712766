"""vast.ai's (local) volumes in the simulated marketplace: disk on one machine, rented apart from any instance, that an
instance rented on that machine may link at a mount path and that outlives it (docs/fleet.md,
"fleet/simulator/volumes.py")."""

from dataclasses import asdict, dataclass, field

from .catalogue import Offer

DEFAULT_SIZE_GB = 15  # what `vastai create volume` rents unless told (--size)
MOUNT_PATH_MAX = 255


@dataclass
class Volume:
    id: int
    machine_id: int
    offer_id: int  # the machine's ask: its storage price and place
    size_gb: float
    name: str
    created_at: float
    instances: list = field(default_factory=list)  # ids of listed instances that link it

    def view(self, offer: Offer, now: float) -> dict:
        """The volume as `GET /volumes` lists it (the fields vast.ai's list documents; `label` is its name)."""
        return {
            "id": self.id,
            "label": self.name,
            "status": "running",  # a volume contract in force
            "disk_space": self.size_gb,
            "machine_id": self.machine_id,
            "host_id": offer.host_id,
            "geolocation": offer.geolocation,
            "public_ipaddr": "",
            "driver_version": offer.driver_version,
            "cuda_max_good": offer.cuda_max_good,
            "reliability2": offer.reliability2,
            "inet_up": offer.inet_up,
            "inet_down": offer.inet_down,
            "storage_cost": offer.storage_cost,
            "storage_total_cost": round(offer.storage_cost * self.size_gb, 4),  # $ a month
            "verification": "verified" if offer.verified else "unverified",
            "start_date": round(self.created_at, 3),
            "instances": list(self.instances),
        }

    def saved(self) -> dict:
        return asdict(self)


def volume_offer(offer: Offer, used_gb: float) -> dict:
    """A machine's disk as `search volumes` lists it: one volume offer per machine, its id the machine's ask id, the
    disk its volumes do not hold yet."""
    return {
        "id": offer.id,
        "machine_id": offer.machine_id,
        "host_id": offer.host_id,
        "disk_space": round(max(0.0, offer.disk_space - used_gb), 1),
        "storage_cost": offer.storage_cost,
        "geolocation": offer.geolocation,
        "inet_up": offer.inet_up,
        "inet_down": offer.inet_down,
        "reliability": offer.reliability2,
        "verified": offer.verified,
        "verification": "verified" if offer.verified else "unverified",
        "cuda_max_good": offer.cuda_max_good,
        "driver_version": offer.driver_version,
        "external": False,
    }


def link_request(volume_info) -> dict | None:
    """A rent's `volume_info` ({"mount_path", "create_new", "volume_id", "size"?, "name"?}, as the CLI builds it for
    --create-volume and --link-volume) checked into plain values, or None when the rent links none; ValueError saying
    what is wrong."""
    if volume_info in (None, {}):
        return None
    if not isinstance(volume_info, dict):
        raise ValueError("volume_info must be an object")  # noqa: TRY004 - the caller answers every refusal as a 400
    mount_path, volume_id = volume_info.get("mount_path"), volume_info.get("volume_id")
    if not isinstance(mount_path, str) or not mount_path.startswith("/") or len(mount_path) > MOUNT_PATH_MAX \
            or any(part in (".", "..") for part in mount_path.split("/")) or mount_path.rstrip("/") == "":
        raise ValueError("volume_info.mount_path must be an absolute path other than /")
    if not isinstance(volume_id, int) or isinstance(volume_id, bool) or volume_id <= 0:
        raise ValueError("volume_info.volume_id must be a volume id (or, with create_new, a volume offer id)")
    size = volume_info.get("size", DEFAULT_SIZE_GB)
    if not isinstance(size, int | float) or isinstance(size, bool) or size <= 0:
        raise ValueError("volume_info.size must be a number of GB > 0")
    name = volume_info.get("name")
    return {"mount_path": mount_path.rstrip("/"), "create_new": volume_info.get("create_new") is True,
            "volume_id": volume_id, "size_gb": float(size), "name": name if isinstance(name, str) else ""}
