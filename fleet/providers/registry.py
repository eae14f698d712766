"""Builds the configured provider client by name, from the settings."""

from django.conf import settings

from .runpod import RunPodClient
from .vast import VastClient

PROVIDERS = ("vast", "runpod")


def get_provider(name: str = "vast"):
    if name == "vast":
        return VastClient(settings.VAST_API_URL, settings.VAST_API_KEY, timeout_s=settings.PROVIDER_TIMEOUT_S,
                          max_retries=settings.PROVIDER_MAX_RETRIES)
    if name == "runpod":
        return RunPodClient(settings.RUNPOD_API_URL, settings.RUNPOD_API_KEY, timeout_s=settings.PROVIDER_TIMEOUT_S,
                            max_retries=settings.PROVIDER_MAX_RETRIES)
    raise ValueError(f"Unknown provider {name!r}; known: {', '.join(PROVIDERS)}.")
