"""When a part of the control plane last finished a pass, kept in the database so that every process reads it."""

from datetime import datetime

from runs.models import Pulse


def record(name: str, now: datetime) -> None:
    Pulse.objects.update_or_create(name=name, defaults={"at": now})


def age_s(name: str, now: datetime) -> float | None:
    """Seconds since `name` last finished a pass, or None if it never did."""
    at = Pulse.objects.filter(name=name).values_list("at", flat=True).first()
    return None if at is None else max(0.0, (now - at).total_seconds())
