"""Per-second charges (gpu, disk, bwu / bwd), worked out from an instance's timestamps at a given simulated time
(docs/fleet.md, "fleet/simulator/billing.py")."""

from .catalogue import HOURS_PER_MONTH
from .instances import Instance


def gpu_seconds(instance: Instance, now: float) -> float:
    """GPU seconds billed by `now`: only while running (an open interval starts when the boot ends, so the created
    and loading minutes bill storage only)."""
    closed = sum(max(0.0, end - start) for start, end in instance.gpu_intervals)
    open_s = now - instance.gpu_billed_since if instance.gpu_billed_since is not None else 0.0
    return closed + max(0.0, open_s)


def closed_gpu_usd(instance: Instance) -> float:
    """Dollars of the closed GPU intervals, each at the price it ran at."""
    if instance.gpu_usd_closed is not None:
        return instance.gpu_usd_closed
    closed_s = sum(max(0.0, end - start) for start, end in instance.gpu_intervals)
    return closed_s / 3600 * instance.gpu_usd_per_hour


def gpu_usd(instance: Instance, now: float) -> float:
    open_s = now - instance.gpu_billed_since if instance.gpu_billed_since is not None else 0.0
    return closed_gpu_usd(instance) + max(0.0, open_s) / 3600 * instance.gpu_usd_per_hour


def gpu_start(instance: Instance, now: float) -> float:
    """When GPU billing first began (the first "running"); the creation time while it has not yet."""
    starts = [start for start, end in instance.gpu_intervals if end > start]
    if instance.gpu_billed_since is not None and instance.gpu_billed_since <= now:
        starts.append(instance.gpu_billed_since)
    return min(starts, default=instance.created_at)


def disk_end(instance: Instance, now: float) -> float:
    if instance.destroyed_at is not None:
        return instance.destroyed_at
    if instance.vanish_at is not None:
        return min(now, instance.vanish_at)
    return now


def gpu_end(instance: Instance, now: float) -> float:
    if instance.gpu_billed_since is not None and instance.gpu_billed_since <= now:
        return now
    ends = [end for start, end in instance.gpu_intervals if end > start]
    return max(ends, default=gpu_start(instance, now))


def charge_lines(instance: Instance, now: float) -> list[dict]:
    offer = instance.offer
    gpu_hours = gpu_seconds(instance, now) / 3600
    disk_hours = max(0.0, disk_end(instance, now) - instance.created_at) / 3600
    lines = [
        _line(instance, "gpu", gpu_usd(instance, now), gpu_hours, gpu_start(instance, now),
              gpu_end(instance, now)),
        _line(instance, "disk", disk_hours * instance.disk_gb * offer.storage_cost / HOURS_PER_MONTH,
              disk_hours * instance.disk_gb, instance.created_at, disk_end(instance, now)),
    ]
    first, last = instance.traffic_first_at, instance.traffic_last_at
    if first is not None and last is not None:  # set together, at the first traffic
        if instance.upload_gb:
            lines.append(
                _line(instance, "bwu", instance.upload_gb * offer.inet_up_cost, instance.upload_gb, first, last)
            )
        if instance.download_gb:
            lines.append(
                _line(instance, "bwd", instance.download_gb * offer.inet_down_cost, instance.download_gb, first, last)
            )
    return lines


def totals(instance: Instance, now: float) -> dict:
    by_type = {"gpu": 0.0, "disk": 0.0, "bwu": 0.0, "bwd": 0.0}
    for line in charge_lines(instance, now):
        by_type[line["type"]] += line["amount"]
    by_type["total"] = round(sum(by_type.values()), 6)
    return by_type


def _line(instance: Instance, kind: str, amount: float, quantity: float, start: float, end: float) -> dict:
    return {
        "instance_id": instance.id,
        "type": kind,
        "amount": round(amount, 6),
        "quantity": round(quantity, 8),
        "start": round(start, 3),
        "end": round(end, 3),
    }
