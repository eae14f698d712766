"""Instances pages: the list with live cost, one instance, and the rent / destroy / keep confirmations."""

import uuid
from dataclasses import dataclass
from decimal import Decimal

from django import forms
from django.conf import settings
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from fleet import actions, enqueue
from fleet.access import boxes_for, require_permission
from fleet.instances import ledger
from fleet.models import Instance, Offer
from fleet.ranking.price import RentalPrice, per_hour, rental_price

RECENT_ENDED = 20


def instance_rows(now, boxes):
    live = list(boxes.filter(state__in=Instance.LIVE_STATES).order_by("-requested_at"))
    ended = list(boxes.exclude(state__in=Instance.LIVE_STATES).order_by("-requested_at")[:RECENT_ENDED])
    costs, rates = ledger.instance_costs(live + ended, now), ledger.billing_rates(live + ended)
    for instance in live + ended:
        instance.cost_usd, instance.billing_rate = costs[instance.pk], rates[instance.pk]
    return live, ended


def instance_list(request):
    now = timezone.now()
    live, ended = instance_rows(now, boxes_for(request.user))
    context = {"live": live, "ended": ended, "account": ledger.account_cost(now), "now": now}
    template = "fleet/_instances.html" if request.headers.get("HX-Request") else "fleet/instances.html"
    return render(request, template, context)


def instance_detail(request, pk):
    instance = get_object_or_404(boxes_for(request.user), pk=pk)
    now = timezone.now()
    instance.cost_usd = ledger.instance_cost(instance, now)
    billing = instance.cost_segments.filter(ended_at__isnull=True).first()  # what it bills now, since when
    instance.billing_rate = billing.usd_per_hour if billing else 0
    instance.billing_since = billing.started_at if billing else None
    difference = None
    if instance.provider_charged_usd is not None:
        difference = instance.cost_usd - instance.provider_charged_usd
    template = "fleet/_instance_state.html" if request.headers.get("HX-Request") else "fleet/instance_detail.html"
    return render(request, template, {
        "instance": instance, "events": instance.events.all()[:200], "now": now, "difference": difference,
        "max_keep_hours": settings.MAX_KEEP_FOR_DEBUG_HOURS,
    })


class RentForm(forms.Form):
    # The page's own random key (uuid4 hex). Stored as manual-<user>-<key>: a form cannot name a key the product uses
    # for its own rents (a run's attempt, a replica, a replacement), nor another user's.
    idempotency_key = forms.RegexField(regex=r"^[0-9a-f]{32}$", widget=forms.HiddenInput,
                                       error_messages={"invalid": "This form is not one the page made: open it again."})
    image = forms.CharField(max_length=300, label="Image")
    disk_gb = forms.IntegerField(min_value=10, max_value=20000, label="Disk (GB)",
                                 error_messages={"min_value": "At least 10 GB.", "max_value": "At most 20,000 GB.",
                                                 "invalid": "Enter a whole number of GB."})
    # The disk the price on the page was worked out for: a rent at another disk size is shown its price first.
    quoted_disk_gb = forms.IntegerField(widget=forms.HiddenInput, required=False)
    over_cap = forms.BooleanField(required=False, label="Rent it anyway, over the spend cap")


@dataclass(frozen=True)
class RentQuote:
    """What renting the offer with this disk costs, and what it does to the account's spend cap."""

    price: RentalPrice
    committed_usd_per_hour: Decimal  # what the boxes the cap counts bill now
    cap_usd_per_hour: Decimal  # 0: no cap
    over_cap: bool

    @property
    def after_usd_per_hour(self) -> Decimal:
        return self.committed_usd_per_hour + self.price.usd_per_hour


def _quote(offer: Offer, disk_gb: int) -> RentQuote:
    price = rental_price(offer, disk_gb)
    committed, cap = ledger.committed_usd_per_hour(), settings.SPEND_CAP_USD_PER_HOUR
    return RentQuote(price, committed, cap, ledger.over_spend_cap(committed, price.usd_per_hour, cap))


def _offer_from(request) -> Offer:
    source = request.POST if request.method == "POST" else request.GET
    return get_object_or_404(Offer, provider=source.get("provider", "vast"), offer_id=source.get("offer", ""),
                             is_bid=source.get("bid") == "1", available=True)


def _confirmed(form: RentForm, quote: RentQuote) -> bool:
    """Whether the person saw the price of what they rent, and confirmed a second time when it goes over the cap;
    the form says what is still to confirm where it is not."""
    if form.cleaned_data["quoted_disk_gb"] != form.cleaned_data["disk_gb"]:
        form.add_error("disk_gb", f"With {form.cleaned_data['disk_gb']} GB the price is "
                                  f"{per_hour(quote.price.usd_per_hour)}: rent again to confirm it.")
        return False
    if quote.over_cap and not form.cleaned_data["over_cap"]:
        form.add_error("over_cap", "This box puts the account over its spend cap: tick this to rent it anyway.")
        return False
    return True


def rent_confirm(request):
    require_permission(request.user, "fleet.rent_instance")
    offer = _offer_from(request)
    if request.method == "POST":
        form = RentForm(request.POST)
        # The page shows again, if it must, with the price of the disk asked for (the quote it is confirmed with).
        quote = _quote(offer, form.cleaned_data["disk_gb"] if form.is_valid() else settings.RENT_DISK_GB)
        if form.is_valid() and _confirmed(form, quote):
            instance, created = actions.request_rent(
                offer=offer, idempotency_key=f"manual-{request.user.pk}-{form.cleaned_data['idempotency_key']}",
                requested_by=request.user,
                image=form.cleaned_data["image"], disk_gb=form.cleaned_data["disk_gb"])
            # The row is committed first: whatever the queue does, the request is kept. A resubmitted form (same key)
            # queues an untouched row's rent again; the rent itself runs once per row.
            if instance.state == Instance.State.REQUESTED and instance.rent_attempted_at is None:
                try:
                    enqueue.rent_instance(instance.pk)
                except enqueue.QueueUnavailable:
                    messages.warning(request, f"{instance.label} is requested, but the task queue cannot be reached "
                                              f"right now: it is rented when the workers are back (checked every "
                                              f"{settings.RENT_QUEUE_GRACE_S} s), or failed with the reason after "
                                              f"{settings.RENT_QUEUE_MAX_WAIT_S // 60} min. Nothing is lost; there is "
                                              "no need to ask again.")
                    return redirect("instance_detail", pk=instance.pk)
            if created:
                messages.success(request, f"Renting offer {offer.offer_id}: {instance.label} is requested.")
            return redirect("instance_detail", pk=instance.pk)
    else:
        quote = _quote(offer, settings.RENT_DISK_GB)
        form = RentForm(initial={"idempotency_key": uuid.uuid4().hex, "image": settings.WORKER_IMAGE,
                                 "disk_gb": settings.RENT_DISK_GB})
    return render(request, "fleet/rent_confirm.html", {"offer": offer, "form": form, "quote": quote,
                                                       "reaper_seconds": settings.REAPER_SECONDS})


def destroy_confirm(request, pk):
    require_permission(request.user, "fleet.destroy_instance")
    instance = get_object_or_404(Instance, pk=pk)
    if request.method == "POST":
        reason = f"destroyed by {request.user.get_username()} from the dashboard"
        # Recorded here (the page shows "stopping"); the provider call runs on a worker.
        instance = actions.request_destroy(instance, reason=reason, by=request.user)
        if instance.state == Instance.State.STOPPING:
            try:
                enqueue.destroy_instance(instance.pk, reason)
            except enqueue.QueueUnavailable:
                messages.warning(request, f"Destroying {instance.label}: the task queue cannot be reached right now, "
                                          "so the next instance sync sends the destroy.")
                return redirect("instance_detail", pk=pk)
        messages.success(request, f"Destroying {instance.label}.")
        return redirect("instance_detail", pk=pk)
    return render(request, "fleet/destroy_confirm.html", {"instance": instance})


def keep_for_debugging(request, pk):
    require_permission(request.user, "fleet.destroy_instance")
    instance = get_object_or_404(Instance, pk=pk)
    if request.method != "POST":
        return redirect("instance_detail", pk=pk)
    try:
        hours = float(request.POST.get("hours", ""))
    except ValueError:
        hours = 0
    if not 0 < hours <= settings.MAX_KEEP_FOR_DEBUG_HOURS:
        messages.error(request, f"Keep it for 0 to {settings.MAX_KEEP_FOR_DEBUG_HOURS} hours.")
    else:
        try:
            instance = actions.keep_for_debugging(instance, hours, by=request.user)
        except actions.KeepRefused as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"{instance.label} is kept until {instance.keep_until:%H:%M} UTC.")
    return redirect("instance_detail", pk=pk)
