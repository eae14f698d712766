"""Builds the configured provider client by name, from the settings."""

from django.conf import settings

from .runpod import RunPodClient
from .runpod_terms import PodTerms
from .vast import VastClient

PROVIDERS = ("vast", "runpod")


def configured_providers() -> list[str]:
    """The providers this deployment has a key for, vast.ai first: each one's offers are refreshed, ranked side by side,
    synced and reconciled."""
    return [name for name, key in (("vast", settings.VAST_API_KEY), ("runpod", settings.RUNPOD_API_KEY)) if key]


def get_provider(name: str = "vast"):
    if name == "vast":
        return VastClient(settings.VAST_API_URL, settings.VAST_API_KEY, timeout_s=settings.PROVIDER_TIMEOUT_S,
                          max_retries=settings.PROVIDER_MAX_RETRIES)
    if name == "runpod":
        terms = PodTerms(cuda_floor=settings.WORKER_IMAGE_CUDA, min_driver=settings.WORKER_IMAGE_MIN_DRIVER,
                         disk_gb=settings.RENT_DISK_GB)
        return RunPodClient(settings.RUNPOD_API_URL, settings.RUNPOD_API_KEY, timeout_s=settings.PROVIDER_TIMEOUT_S,
                            max_retries=settings.PROVIDER_MAX_RETRIES, terms=terms)
    raise ValueError(f"Unknown provider {name!r}; known: {', '.join(PROVIDERS)}.")
