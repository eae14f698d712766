"""Ranking the stored offers: the page, the Celery task and the rank_offers command all come through here."""

from django.utils import timezone

from fleet.calibration import load_calibration
from fleet.models import Offer, OfferProfile
from fleet.ranking import OfferFilters, Ranking, Recipe, rank_offers

PROFILE_SUMMARY_SIZE = 5


def stored_offers() -> list:
    return [offer.to_record() for offer in Offer.objects.filter(available=True).order_by("id")]


def rank_stored_offers(recipe: Recipe, filters: OfferFilters) -> Ranking:
    return rank_offers(stored_offers(), recipe, filters, calibration=load_calibration())


def profile_settings(profile: OfferProfile) -> tuple[Recipe, OfferFilters]:
    return Recipe.from_dict(profile.recipe), OfferFilters.from_dict(profile.filters)


def rank_profile(profile: OfferProfile) -> Ranking:
    return rank_stored_offers(*profile_settings(profile))


def refresh_profile_rankings() -> int:
    """Ranks the current offers for every saved profile and keeps the best few on the profile."""
    profiles = list(OfferProfile.objects.all())
    if not profiles:
        return 0
    offers, calibration = stored_offers(), load_calibration()
    for profile in profiles:
        ranking = rank_offers(offers, *profile_settings(profile), calibration=calibration)
        summary = ranking.to_dict(limit=PROFILE_SUMMARY_SIZE)
        profile.last_ranking = {"ranked": summary["ranked"], "passed": len(ranking.entries),
                                "excluded": len(ranking.excluded)}
        profile.last_ranked_at = timezone.now()
        profile.save(update_fields=["last_ranking", "last_ranked_at"])
    return len(profiles)
