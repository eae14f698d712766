"""The Offers page: the stored offers ranked for a recipe and filters, and saving them as a profile."""

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from fleet.access import can, require_permission
from fleet.models import Offer, OfferProfile, OfferRefresh
from fleet.offers import calibration, exclusions, profiles
from fleet.offers.forms import RankingForm
from fleet.offers.ranked import profile_settings, rank_stored_offers
from fleet.ranking.price import rental_price

RANKED_SHOWN = 100
EXCLUDED_SHOWN_PER_REASON = 50


def _sorted(entries, sort: str, disk_gb: int):
    """The ranked offers in the order the page lists them. In the ranking's own order they need no sort, and only
    the ones shown are made into RankedOffers (Ranking.entries makes them as they are read)."""
    if not sort or sort == "score":
        return entries
    return sorted(entries, key={
        "total": lambda e: e.total_usd,
        "wall": lambda e: e.wall_hours,
        "price": lambda e: rental_price(e.offer, disk_gb).usd_per_hour,
    }[sort])


def _form_for(request) -> tuple[RankingForm, OfferProfile | None]:
    profile = None
    if request.GET.get("profile"):
        profile = get_object_or_404(OfferProfile, name=request.GET["profile"])
    if "phases" in request.GET:  # the form itself was submitted
        return RankingForm(request.GET), profile
    recipe, filters = profile_settings(profile)
    data = RankingForm.data_for(recipe, filters)
    data.update({key: request.GET[key] for key in ("sort", "find") if key in request.GET})  # a link to one offer
    return RankingForm(data), profile


def _matches(offer, needle: str) -> bool:
    return needle in offer.offer_id or needle.lower() in offer.gpu_name.lower()


def offers(request):
    form, profile = _form_for(request)
    is_htmx = bool(request.headers.get("HX-Request"))
    context = {"form": form, "profile": profile, "profiles": OfferProfile.objects.order_by("name"),
               "offer_count": Offer.objects.filter(available=True).count(), "oob_errors": is_htmx,
               "simulated": calibration.simulated_provider("vast"),
               "last_refresh": OfferRefresh.objects.filter(finished_at__isnull=False).order_by("-started_at").first()}
    if form.is_valid():
        disk_gb = int(form.recipe.rent_disk_gb)
        ranking = rank_stored_offers(form.recipe, form.filters)
        entries = _sorted(ranking.entries, form.cleaned_data["sort"], disk_gb)
        excluded = ranking.excluded
        needle = form.cleaned_data["find"].strip()
        if needle:
            entries = [e for e in entries if _matches(e.offer, needle)]
            excluded = [x for x in excluded if _matches(x.offer, needle)]
        context.update(ranking=ranking, ranked_count=len(entries), ranked_shown=RANKED_SHOWN, disk_gb=disk_gb,
                       rows=[(e, rental_price(e.offer, disk_gb)) for e in entries[:RANKED_SHOWN]],
                       excluded_groups=exclusions.grouped(excluded, EXCLUDED_SHOWN_PER_REASON, disk_gb),
                       excluded_count=len(excluded))
    template = "fleet/_ranking.html" if is_htmx else "fleet/offers.html"
    return render(request, template, context)


@require_POST
def save_profile(request):
    may_add = can(request.user, "fleet.add_offerprofile")
    may_replace = can(request.user, "fleet.change_offerprofile")
    if not (may_add or may_replace):
        require_permission(request.user, "fleet.add_offerprofile")
    form = RankingForm(request.POST)
    name = slugify(request.POST.get("profile_name", ""))
    if not name or not form.is_valid():
        problems = "; ".join(f"{label}: {message}" if label else message for _, label, message in form.error_list())
        messages.error(request, "Profile not saved: " + ("give it a name." if not name else problems))
        return _redirect(request, reverse("offers"))
    try:
        replaced = profiles.save(name, form.recipe, form.filters, by=request.user, may_add=may_add,
                                 may_replace=may_replace)
    except profiles.Refused as exc:
        messages.error(request, f"Profile {name!r} not saved: {exc}")
        return _redirect(request, reverse("offers"))
    messages.success(request, f"Profile {name!r} {'replaced' if replaced else 'saved'}.")
    return _redirect(request, reverse("offers") + f"?profile={name}")


def _redirect(request, url: str):
    if request.headers.get("HX-Request"):  # htmx follows this header with a full page load
        return HttpResponse(status=204, headers={"HX-Redirect": url})
    return redirect(url)
