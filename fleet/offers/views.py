"""The Offers page: the stored offers ranked for a recipe and filters, saving them as a profile and deleting one."""

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from fleet.access import can, require_permission
from fleet.models import Offer, OfferProfile, OfferRefresh
from fleet.offers import calibration, exclusions, profiles
from fleet.offers.forms import ProfileNameForm, RankingForm
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
    return _page(request, form, profile, "fleet/_ranking.html" if is_htmx else "fleet/offers.html")


def _page(request, form: RankingForm, profile, template: str, *, naming=None, status: int = 200):
    """The Offers page (or its ranking part) for `form` as it stands; `naming` is a profile name form that was
    refused, shown with its message and what was typed."""
    context = {"form": form, "profile": profile, "profiles": OfferProfile.objects.order_by("name"),
               "naming": naming or ProfileNameForm(), "offer_count": Offer.objects.filter(available=True).count(),
               "oob_errors": bool(request.headers.get("HX-Request")),
               "simulated": calibration.simulated_provider("vast"),
               "last_refresh": OfferRefresh.objects.filter(finished_at__isnull=False).order_by("-started_at").first()}
    if form.is_valid():
        disk_gb = int(form.recipe.rent_disk_gb)
        ranking = rank_stored_offers(form.recipe, form.filters)
        entries = _sorted(ranking.entries, form.cleaned_data["sort"], disk_gb)
        needle = form.cleaned_data["find"].strip()
        if needle:
            entries = [e for e in entries if _matches(e.offer, needle)]
        excluded = [x for x in ranking.excluded if _matches(x.offer, needle)] if needle else ranking.excluded
        context.update(ranking=ranking, ranked_count=len(entries), ranked_shown=RANKED_SHOWN, disk_gb=disk_gb,
                       rows=[(e, rental_price(e.offer, disk_gb)) for e in entries[:RANKED_SHOWN]],
                       excluded_groups=exclusions.grouped(excluded, EXCLUDED_SHOWN_PER_REASON, disk_gb),
                       excluded_count=len(excluded))
    return render(request, template, context, status=status)


@require_POST
def save_profile(request):
    may_add = can(request.user, "fleet.add_offerprofile")
    may_replace = can(request.user, "fleet.change_offerprofile")
    if not (may_add or may_replace):
        require_permission(request.user, "fleet.add_offerprofile")
    form, naming = RankingForm(request.POST), ProfileNameForm(request.POST)
    if form.is_valid() and naming.is_valid():
        name = naming.cleaned_data["profile_name"]
        try:
            replaced = profiles.save(name, form.recipe, form.filters, by=request.user, may_add=may_add,
                                     may_replace=may_replace)
        except profiles.Refused as exc:
            naming.add_error("profile_name", f"Not saved as {name!r}: {exc}")
        else:
            messages.success(request, f"Profile {name!r} {'replaced' if replaced else 'saved'}.")
            return _redirect(request, reverse("offers") + f"?profile={name}")
    naming.is_valid()  # a refused ranking form still says what is wrong with the name
    if request.headers.get("HX-Request"):
        # The page keeps what was typed; each message goes beside its field (a swap htmx makes on a 2xx only).
        return render(request, "fleet/_profile_not_saved.html", {"form": form, "naming": naming})
    return _page(request, form, None, "fleet/offers.html", naming=naming, status=400)


@require_http_methods(["GET", "POST"])
def delete_profile(request, pk):
    """GET asks to confirm, saying which runs and inference models rank with the profile; POST deletes it."""
    require_permission(request.user, "fleet.delete_offerprofile")
    profile = get_object_or_404(OfferProfile, pk=pk)
    users = profiles.ranked_with(profile)
    if request.method == "GET":
        return render(request, "fleet/profile_delete_confirm.html", {"profile": profile, "users": users,
                                                                      "users_said": profiles.said(users)})
    profile.delete()
    fallback = f" {profiles.said(users)} that ranked with it now rank with the defaults." if users else ""
    messages.success(request, f"Profile {profile.name!r} deleted.{fallback}")
    return redirect("offers")


def _redirect(request, url: str):
    if request.headers.get("HX-Request"):  # htmx follows this header with a full page load
        return HttpResponse(status=204, headers={"HX-Redirect": url})
    return redirect(url)
