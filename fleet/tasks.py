from celery import shared_task

from fleet import offer_ranking, offers
from fleet.providers.errors import ProviderUnavailable, RateLimited


@shared_task(
    autoretry_for=(ProviderUnavailable, RateLimited),
    retry_backoff=10,
    retry_backoff_max=120,
    max_retries=3,
    # A refresh that waits longer than its own interval is stale; the next beat tick does it again.
    expires=60,
)
def refresh_offers(provider: str = "vast") -> dict:
    refresh = offers.refresh_offers(provider)
    rank_profiles.delay()
    return {"provider": provider, "offers": refresh.offers_seen, "skipped": refresh.offers_skipped}


@shared_task
def rank_profiles() -> int:
    """Ranks the fresh offers for every saved profile so the dashboard shows each one's best offer."""
    return offer_ranking.refresh_profile_rankings()
