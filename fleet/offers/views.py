"""The Offers page: the stored offers ranked for a recipe and filters, and saving them as a profile."""

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from fleet.access import can, require_permission
from fleet.models import Offer, OfferProfile, OfferRefresh
from fleet.offers import profiles
from fleet.offers.forms import RankingForm
from fleet.offers.ranked import profile_settings, rank_stored_offers

RANKED_SHOWN = 100
EXCLUDED_SHOWN = 200

_SORT_KEYS = {
    "score": lambda e: e.rank,
    "total": lambda e: e.total_usd,
    "wall": lambda e: e.wall_hours,
    "price": lambda e: e.usd_per_hour,
}


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
    context = {"form": form, "profile": profile, "profiles": OfferProfile.objects.order_by("name"),
               "offer_count": Offer.objects.filter(available=True).count(),
               "last_refresh": OfferRefresh.objects.filter(finished_at__isnull=False).order_by("-started_at").first()}
    if form.is_valid():
        ranking = rank_stored_offers(form.recipe, form.filters)
        entries = sorted(ranking.entries, key=_SORT_KEYS[form.cleaned_data["sort"] or "score"])
        excluded = ranking.excluded
        needle = form.cleaned_data["find"].strip()
        if needle:
            entries = [e for e in entries if _matches(e.offer, needle)]
            excluded = [x for x in excluded if _matches(x.offer, needle)]
        context.update(ranking=ranking, entries=entries[:RANKED_SHOWN], ranked_count=len(entries),
                       excluded=excluded[:EXCLUDED_SHOWN], excluded_count=len(excluded),
                       ranked_shown=RANKED_SHOWN, excluded_shown=EXCLUDED_SHOWN)
    template = "fleet/_ranking.html" if request.headers.get("HX-Request") else "fleet/offers.html"
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
        messages.error(request, "Profile not saved: " + ("give it a name." if not name else
                                                         form.errors.as_text().replace("\n", " ")))
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
