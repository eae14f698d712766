"""A provider's volume that a run's boxes mount, where the base model is kept between boxes: whether one is usable for a
model, which offers can mount it (a vast.ai volume's machine; RunPod Secure Cloud, in the network volume's data
centre), and what it costs to keep (docs/fleet.md, "fleet/volumes.py")."""

import re
from decimal import Decimal

from fleet.providers.errors import OfferUnavailable
from fleet.providers.records import VolumeMount, VolumeRecord
from fleet.providers.registry import get_provider
from fleet.providers.runpod import NETWORK_VOLUME_CLOUD, parse_offer_id

DEFAULT_MOUNT_PATH = "/workspace/models"
_MOUNT_PATH = re.compile(r"(/[A-Za-z0-9._-]+)+")
# Where a volume mounted would hide what the box needs to start.
_SYSTEM = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin", "/sys", "/tmp",
           "/usr", "/var", "/opt")


class VolumeRefused(ValueError):
    """The volume a run names cannot be used, in words a user can act on."""


def mount_path_problem(path: str) -> str | None:
    """Why `path` cannot be where a volume is mounted, or None."""
    if not isinstance(path, str) or len(path) > 200 or not _MOUNT_PATH.fullmatch(path) \
            or any(part in (".", "..") for part in path.split("/")):
        return "a mount path is an absolute path of letters, digits, '.', '_', '-' and '/', e.g. /workspace/models"
    if any(path == system or path.startswith(system + "/") for system in _SYSTEM):
        return f"{path} would hide what the box needs to start: mount it under /workspace or /data"
    return None


def volume_problem(volume: VolumeRecord, need_gb: float) -> str | None:
    """Why `volume` cannot hold a model of `need_gb` for a run's boxes now, or None. Pure."""
    if not volume.usable:
        return f"volume {volume.volume_id} is {volume.status or 'not usable'} at {volume.provider}, not ready to mount"
    if volume.size_gb < need_gb:
        return (f"volume {volume.volume_id} has {volume.size_gb:g} GB, and the model needs {need_gb:g} GB: grow it, or "
                "name a larger one")
    return None


def find(provider: str, volume_id: str) -> VolumeRecord:
    """The account's volume at the provider; VolumeRefused when the account has none of that id."""
    with get_provider(provider) as client:
        volumes = client.list_volumes()
    for volume in volumes:
        if volume.volume_id == volume_id:
            return volume
    held = ", ".join(f"{v.volume_id} ({v.name or 'no name'})" for v in volumes[:10]) or "none"
    raise VolumeRefused(f"the {provider} account has no volume {volume_id} (it has: {held})")


def pinned(volume: VolumeRecord, mount_path: str) -> dict:
    """What a run keeps of its volume: enough to rank, rent and price without asking the provider again."""
    return {"provider": volume.provider, "id": volume.volume_id, "name": volume.name, "mount_path": mount_path,
            "size_gb": volume.size_gb, "machine_id": volume.machine_id, "data_center_id": volume.data_center_id,
            "storage_usd_per_gb_month": (None if volume.storage_usd_per_gb_month is None
                                         else str(volume.storage_usd_per_gb_month))}


def mounts(offer, volume: dict) -> bool:
    """Whether a box rented from `offer` can mount the run's `volume` (as `pinned` keeps it). Pure."""
    if offer.provider != volume["provider"]:
        return False
    if offer.provider == "vast":
        return bool(volume.get("machine_id")) and str(offer.machine_id) == volume["machine_id"]
    if offer.provider == "runpod":
        try:
            return parse_offer_id(offer.offer_id)[1] == NETWORK_VOLUME_CLOUD
        except OfferUnavailable:
            return False
    return False


def lost(volume: dict, bad_machines) -> bool:
    """Whether no box can mount the run's `volume` any more: a vast.ai volume lives on one machine, and the run has
    counted that machine as bad (its host died or hung). Pure."""
    return bool(volume) and volume["provider"] == "vast" and bool(volume.get("machine_id")) and \
        str(volume["machine_id"]) in {str(machine) for machine in bad_machines or ()}


def where(volume: dict) -> str:
    """Which offers can mount it, in words."""
    if volume["provider"] == "vast":
        return f"vast.ai machine {volume['machine_id']} only (a vast.ai volume lives on one machine)"
    return (f"RunPod Secure Cloud in data centre {volume['data_center_id']} only (a network volume pins its pods to "
            "its data centre)")


def rent_mount(volume: dict) -> VolumeMount | None:
    """The mount a rent sends, from an instance's `volume` ({id, mount_path, data_center_id}); None for none."""
    if not volume:
        return None
    return VolumeMount(volume["id"], volume["mount_path"], volume.get("data_center_id") or "")


def storage_usd_per_month(volume: dict) -> Decimal | None:
    """What keeping the volume costs a month at its provider's rate, whether or not a box mounts it."""
    rate = volume.get("storage_usd_per_gb_month")
    if rate is None:
        return None
    return (Decimal(rate) * Decimal(str(volume["size_gb"]))).quantize(Decimal("0.01"))
