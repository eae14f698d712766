"""The fleet in the admin, to look at: nothing is added, changed or deleted here. Every change that costs money,
rents or destroys a box, or decides what a box runs goes through the product's own pages and fleet.actions, which
validate it and check the permission (fleet.access); the admin's actions lead there or to the same checks."""

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django_celery_beat import admin as beat_admin
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule

from fleet import actions as fleet_actions, enqueue
from fleet.access import can
from fleet.models import Alert, Instance, InstanceEvent, Offer, OfferProfile, OfferRefresh, ThroughputCalibration


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shows a model's rows and changes none: an edit here would skip the product's checks (a keep_until in 2099
    outlives the reaper's age and spend cap; a run's bucket or recipe is what its box writes to and executes)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Offer)
class OfferAdmin(ReadOnlyAdmin):
    list_display = ["offer_id", "gpu_name", "num_gpus", "gpu_ram_gb", "total_usd_per_hour", "reliability",
                    "geolocation", "is_bid", "available", "last_seen_at"]
    list_filter = ["provider", "available", "is_bid", "verified", "gpu_name"]
    search_fields = ["offer_id", "gpu_name", "geolocation", "machine_id"]
    actions = ["rent"]

    def has_rent_permission(self, request):
        return can(request.user, "fleet.rent_instance")

    @admin.action(description="Rent the selected offer…", permissions=["rent"])
    def rent(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one offer to rent.", messages.WARNING)
            return None
        offer = queryset.get()
        # The same confirmation page (and permission check) as the dashboard's Rent button.
        query = urlencode({"provider": offer.provider, "offer": offer.offer_id, "bid": int(offer.is_bid)})
        return redirect(f"{reverse('rent_confirm')}?{query}")  # a RunPod offer id may hold + & # =: encoded


class InstanceEventInline(ReadOnlyInline):
    model = InstanceEvent


@admin.register(Instance)
class InstanceAdmin(ReadOnlyAdmin):
    """Rented through the Rent confirmation, kept for debugging (with its capped expiry) on the instance's page,
    destroyed by the action below."""

    list_display = ["label", "state", "provider", "provider_instance_id", "gpu_name", "usd_per_hour",
                    "requested_at", "keep_until"]
    list_filter = ["state", "provider", "purpose", "is_bid"]
    search_fields = ["label", "provider_instance_id", "offer_id"]
    inlines = [InstanceEventInline]
    actions = ["destroy"]

    def has_destroy_permission(self, request):
        return can(request.user, "fleet.destroy_instance")

    @admin.action(description="Destroy the selected instances…", permissions=["destroy"])
    def destroy(self, request, queryset):
        live = queryset.filter(state__in=Instance.LIVE_STATES)
        if request.POST.get("confirmed") == "yes":
            reason = f"destroyed by {request.user.get_username()} from the admin"
            sent, unsent = [], []
            for instance in live:
                instance = fleet_actions.request_destroy(instance, reason=reason, by=request.user)  # recorded first
                try:
                    if instance.state == Instance.State.STOPPING:
                        enqueue.destroy_instance(instance.pk, reason)
                    sent.append(instance.label)
                except enqueue.QueueUnavailable:  # said, with the rest of the selection still handed over
                    unsent.append(instance.label)
            if sent:
                self.message_user(request, f"Destroying {len(sent)} instance(s).", messages.SUCCESS)
            if unsent:
                self.message_user(request, f"Destroying, but the task queue cannot be reached right now, so the next "
                                           f"instance sync sends the destroy: {', '.join(unsent)}.", messages.WARNING)
            return None
        return TemplateResponse(request, "admin/fleet/destroy_confirm.html", {
            **self.admin_site.each_context(request), "title": "Destroy instances?", "instances": live,
            "queryset": queryset, "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        })


@admin.register(OfferRefresh)
class OfferRefreshAdmin(ReadOnlyAdmin):
    list_display = ["provider", "started_at", "finished_at", "offers_seen", "offers_skipped", "error"]
    list_filter = ["provider"]


@admin.register(OfferProfile)
class OfferProfileAdmin(ReadOnlyAdmin):
    """Saved from the Offers page: runs and inference replicas rank the offers they rent with these."""

    list_display = ["name", "created_by", "updated_at", "last_ranked_at"]


@admin.register(ThroughputCalibration)
class ThroughputCalibrationAdmin(ReadOnlyAdmin):
    """Folded in from finished runs; the ranking's cost projections rest on it."""

    list_display = ["gpu_model", "kernel_path", "model_tflops", "weight", "measured_runs", "updated_at"]


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ["kind", "created_at", "instance", "message"]
    list_filter = ["kind"]


# The work schedule (django-celery-beat's tables) is written from settings.CELERY_BEAT_SCHEDULE: shown here, never
# edited, switched off or run by hand, so no one pauses the reaper or schedules a rent or destroy around the checks.
_BEAT_ADMINS = {PeriodicTask: beat_admin.PeriodicTaskAdmin, IntervalSchedule: beat_admin.IntervalScheduleAdmin,
                CrontabSchedule: beat_admin.CrontabScheduleAdmin, SolarSchedule: beat_admin.SolarScheduleAdmin,
                ClockedSchedule: beat_admin.ClockedScheduleAdmin}
for _model, _shown_by in _BEAT_ADMINS.items():
    admin.site.unregister(_model)
    admin.site.register(_model, type(_shown_by.__name__, (ReadOnlyAdmin, _shown_by), {"actions": []}))
