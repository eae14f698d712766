"""What the embedded default's simulated marketplace offers a person trying the product by hand: its address, the
commands that kill or hang one of its boxes, and its demo webhook receivers (README, "A first run")."""

from django.conf import settings

SIMULATED_PROVIDER = "vast"  # the simulated marketplace stands in for vast.ai


def simulator_url() -> str:
    """The enabled simulated marketplace's http://host:port, or "" where none runs."""
    if not settings.SIMULATOR_ENABLED:
        return ""
    host = f"[{settings.SIMULATOR_HOST}]" if ":" in settings.SIMULATOR_HOST else settings.SIMULATOR_HOST
    return f"http://{host}:{settings.SIMULATOR_PORT}"


def box_commands(instance) -> dict[str, str]:
    """{"kill": ..., "hang": ...}: the curl lines that make the simulated marketplace's host of this box die or
    hang; empty for a box elsewhere or not rented yet."""
    base = simulator_url()
    if not base or instance.provider != SIMULATED_PROVIDER or not instance.provider_instance_id:
        return {}
    return {fault: f"curl -X POST {base}/_sim/instances/{instance.provider_instance_id}/{fault}"
            for fault in ("kill", "hang")}


def webhook_receiver_url(name: str = "demo") -> str:
    """A webhook receiver the simulated marketplace hosts (fleet/simulator/webhooks.py), "" where none runs."""
    base = simulator_url()
    return f"{base}/_sim/webhooks/{name}" if base else ""
