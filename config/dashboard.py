"""The dashboard's home page: the one page that reads both apps (runs builds on fleet, never the other way round)."""

from collections import Counter

from django.conf import settings
from django.db.models import Count
from django.shortcuts import render
from django.utils import timezone

from fleet.access import alerts_for
from fleet.instances import ledger
from fleet.models import Instance, Offer, OfferProfile, OfferRefresh
from runs.lifecycle import shown_state
from runs.models import Run
from runs.sharing import runs_for


def _spend_against_cap(account) -> dict:
    cap = settings.SPEND_CAP_USD_PER_HOUR
    percent = float(account.burn_usd_per_hour / cap * 100) if cap > 0 else None
    return {"cap": cap, "percent": percent, "bar": min(100.0, percent or 0.0),
            "level": "over" if (percent or 0) >= 100 else "high" if (percent or 0) >= 80 else "ok"}


def dashboard(request):
    now = timezone.now()
    states = dict(Instance.objects.values_list("state").annotate(n=Count("id")).order_by())
    account = ledger.account_cost(now)
    run_states = Counter()
    shown = runs_for(request.user).values_list("state", "restarts").annotate(n=Count("id")).order_by()
    for state, restarts, n in shown:
        run_states[shown_state(state, restarts)] += n
    return render(request, "dashboard.html", {
        "account": account,
        "spend": _spend_against_cap(account),
        "run_states": [(state, run_states.get(state, 0)) for state, _ in Run.State.choices],
        "recent_alerts": alerts_for(request.user).select_related("instance").order_by("-created_at", "-id")[:8],
        "instance_states": [(state, states.get(state, 0)) for state, _ in Instance.State.choices],
        "offer_count": Offer.objects.filter(available=True).count(),
        "last_refresh": OfferRefresh.objects.order_by("-started_at").first(),
        "profiles": OfferProfile.objects.exclude(last_ranking=None).order_by("name"),
    })
