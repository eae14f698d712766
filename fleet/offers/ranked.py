"""Ranking the stored offers: the page, the Celery task and the rank_offers command all come through here."""

import dataclasses

from django.conf import settings
from django.utils import timezone

from fleet.offers.calibration import load_calibration
from fleet.models import Offer, OfferProfile
from fleet.ranking import OfferFilters, Ranking, Workload, rank_offers
from fleet.ranking.filters import parse_version, version_at_least

PROFILE_SUMMARY_SIZE = 5


def stored_offers() -> tuple[list, list]:
    """The listed offers as records, and the float twins of their prices the refresh stored (rank_offers(prices=))."""
    rows = list(Offer.objects.filter(available=True).order_by("id"))
    return [row.to_record() for row in rows], [row.prices() for row in rows]


def rank_stored_offers(recipe: Workload, filters: OfferFilters) -> Ranking:
    offers, prices = stored_offers()
    return rank_offers(offers, recipe, filters, calibration=load_calibration(), prices=prices)


def profile_settings(profile: OfferProfile | None) -> tuple[Workload, OfferFilters]:
    """A saved profile's recipe and filters, or the defaults without one."""
    if profile is None:
        return Workload(), OfferFilters()
    return Workload.from_dict(profile.recipe), OfferFilters.from_dict(profile.filters)


def for_worker_image(filters: OfferFilters, *, cuda: str | None = None, driver: str | None = None) -> OfferFilters:
    """The filters raised to at least the driver and CUDA that the worker image needs (settings.WORKER_IMAGE_CUDA),
    whatever a profile saved: a host with an older driver rents fine and then fails CUDA init with error 803."""
    cuda = cuda or settings.WORKER_IMAGE_CUDA
    driver = driver or settings.WORKER_IMAGE_MIN_DRIVER
    saved = parse_version(filters.min_driver_version) if filters.min_driver_version else None
    needed = parse_version(driver)
    if saved is None or needed is None or not version_at_least(saved, needed):
        filters = dataclasses.replace(filters, min_driver_version=driver)
    if filters.min_cuda < float(cuda):
        filters = dataclasses.replace(filters, min_cuda=float(cuda))
    return filters


def run_settings(profile: OfferProfile | None) -> tuple[Workload, OfferFilters]:
    """What a training run ranks offers with: its profile (or the defaults), never below what the image needs."""
    return rent_settings(profile, settings.WORKER_IMAGE)


def rent_settings(profile: OfferProfile | None, image: str) -> tuple[Workload, OfferFilters]:
    """What the product ranks offers with when it rents for its own work: the profile (or the defaults), and for
    the images it knows the CUDA of (the worker image, and the stock image it bootstraps) never below their needs."""
    recipe, filters = profile_settings(profile)
    if image and image in (settings.WORKER_IMAGE, settings.WORKER_STOCK_IMAGE):  # the stock image may be unset
        filters = for_worker_image(filters)
    return recipe, filters


def refresh_profile_rankings() -> int:
    """Ranks the current offers for every saved profile and keeps the best few on the profile."""
    profiles = list(OfferProfile.objects.all())
    if not profiles:
        return 0
    (offers, prices), calibration = stored_offers(), load_calibration()
    for profile in profiles:
        ranking = rank_offers(offers, *profile_settings(profile), calibration=calibration, prices=prices)
        summary = ranking.to_dict(limit=PROFILE_SUMMARY_SIZE)
        profile.last_ranking = {"ranked": summary["ranked"], "passed": len(ranking.entries),
                                "excluded": len(ranking.excluded)}
        profile.last_ranked_at = timezone.now()
        profile.save(update_fields=["last_ranking", "last_ranked_at"])
    return len(profiles)
