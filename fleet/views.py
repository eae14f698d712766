from django.shortcuts import render

from fleet.models import Offer, OfferRefresh

OFFER_PAGE_SIZE = 500


def offers(request):
    listed = Offer.objects.filter(available=True).order_by("total_usd_per_hour", "offer_id")
    return render(request, "fleet/offers.html", {
        "offers": listed[:OFFER_PAGE_SIZE],
        "offer_count": listed.count(),
        "page_size": OFFER_PAGE_SIZE,
        "last_refresh": OfferRefresh.objects.filter(finished_at__isnull=False).order_by("-started_at").first(),
    })


def instances(request):
    return render(request, "fleet/instances.html")


def inference(request):
    return render(request, "fleet/inference.html")


def alerts(request):
    return render(request, "fleet/alerts.html")


def dashboard(request):
    return render(request, "dashboard.html", {
        "offer_count": Offer.objects.filter(available=True).count(),
        "last_refresh": OfferRefresh.objects.order_by("-started_at").first(),
    })
