"""Saving the Offers page's settings as a profile. A profile is shared: the runs and inference replicas that name it
rank the offers they rent by it, so writing over one is a change (its own permission), not an add; deleting one
leaves them on the defaults (ranked_with says which)."""

from django.db import IntegrityError, transaction
from django.utils import timezone

from fleet.models import OfferProfile
from fleet.ranking import OfferFilters, Workload

TAKEN = ("a profile of that name exists and runs may rank offers with it; replacing it needs the change offer "
         "profile permission. Save it under another name.")

NAME_MAX = OfferProfile._meta.get_field("name").max_length or 0  # what a profile's name may hold


class Refused(Exception):
    """The profile was not saved; the message says why."""


def save(name: str, recipe: Workload, filters: OfferFilters, *, by, may_add: bool, may_replace: bool) -> bool:
    """Makes the profile `name` (may_add) or writes over the one of that name (may_replace). True when it replaced
    one; Refused when the permission it needed is not given."""
    if not name or len(name) > NAME_MAX:  # checked here too: SQLite keeps a longer one, PostgreSQL fails on it
        raise Refused(f"a profile's name is 1 to {NAME_MAX} characters, not {len(name)}.")
    values = {"recipe": recipe.to_dict(), "filters": filters.to_dict()}
    if may_replace and OfferProfile.objects.filter(name=name).update(**values, updated_at=timezone.now()):
        return True
    if not may_replace and OfferProfile.objects.filter(name=name).exists():
        raise Refused(TAKEN)
    if not may_add:
        raise Refused("there is no profile of that name to replace, and making one needs the add offer profile "
                      "permission.")
    try:
        with transaction.atomic():
            OfferProfile.objects.create(name=name, **values, created_by=by)
    except IntegrityError:  # someone saved that name between the check and the insert
        raise Refused("someone saved a profile of that name a moment ago; save again to replace it." if may_replace
                      else TAKEN) from None
    return False


def ranked_with(profile: OfferProfile) -> list[tuple[int, str]]:
    """What ranks offers with `profile` (runs, inference models) as (count, plural name), the counted ones only;
    deleting the profile leaves them on the defaults."""
    counted = []
    for relation in OfferProfile._meta.related_objects:
        model = relation.related_model
        count = model.objects.filter(**{relation.field.name: profile}).count()
        if count:
            meta = model._meta
            counted.append((count, str(meta.verbose_name if count == 1 else meta.verbose_name_plural)))
    return counted


def said(counted: list[tuple[int, str]]) -> str:
    """"3 runs and 1 inference model", from ranked_with."""
    parts = [f"{count} {name}" for count, name in counted]
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
