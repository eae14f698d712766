import json as jsonlib

from django.core.management.base import BaseCommand, CommandError

from fleet.models import OfferProfile
from fleet.offers.ranked import profile_settings, rank_stored_offers
from fleet.ranking import OfferFilters, Workload


class Command(BaseCommand):
    help = "Rank the stored offers for a saved profile (or the defaults) by steps per dollar of the whole run."

    def add_arguments(self, parser):
        parser.add_argument("--profile", help="a saved offer profile's name")
        parser.add_argument("--json", action="store_true", help="print the ranking as JSON")
        parser.add_argument("--limit", type=int, default=20, help="how many ranked offers to print")

    def handle(self, *args, profile, json: bool, limit: int, **options):
        if profile:
            try:
                recipe, filters = profile_settings(OfferProfile.objects.get(name=profile))
            except OfferProfile.DoesNotExist:
                names = ", ".join(OfferProfile.objects.values_list("name", flat=True)) or "none saved"
                raise CommandError(f"No offer profile {profile!r} (profiles: {names}).") from None
        else:
            recipe, filters = Workload(), OfferFilters()
        ranking = rank_stored_offers(recipe, filters)
        if json:
            self.stdout.write(jsonlib.dumps(ranking.to_dict(limit=limit), indent=2))
            return
        self.stdout.write(f"{len(ranking.entries)} ranked, {len(ranking.excluded)} excluded "
                          f"for {recipe.model}, {recipe.total_steps} steps")
        for e in ranking.entries[:limit]:
            self.stdout.write(f"{e.rank:>3}  {e.offer.offer_id:>10}  {e.offer.num_gpus}x {e.offer.gpu_name:<18} "
                              f"{e.steps_per_usd:8.1f} steps/$  ${e.usd_per_hour:.3f}/h  {e.wall_hours:6.1f} h  "
                              f"${e.total_usd:.2f}{'  (estimate)' if e.estimated else ''}"
                              f"{'  (interruptible)' if e.interruptible else ''}")
