from django.contrib import admin, messages
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from fleet import enqueue
from fleet.access import can
from fleet.models import Alert, Instance, InstanceEvent, Offer, OfferProfile, OfferRefresh, ThroughputCalibration


@admin.register(Offer)
class OfferAdmin(admin.ModelAdmin):
    list_display = ["offer_id", "gpu_name", "num_gpus", "gpu_ram_gb", "total_usd_per_hour", "reliability",
                    "geolocation", "is_bid", "available", "last_seen_at"]
    list_filter = ["provider", "available", "is_bid", "verified", "gpu_name"]
    search_fields = ["offer_id", "gpu_name", "geolocation", "machine_id"]
    actions = ["rent"]

    def has_add_permission(self, request):
        return False  # offers come from the marketplace, not from people

    def has_change_permission(self, request, obj=None):
        return False

    def has_rent_permission(self, request):
        return can(request.user, "fleet.rent_instance")

    @admin.action(description="Rent the selected offer…", permissions=["rent"])
    def rent(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one offer to rent.", messages.WARNING)
            return None
        offer = queryset.get()
        # The same confirmation page (and permission check) as the dashboard's Rent button.
        return redirect(f"{reverse('rent_confirm')}?provider={offer.provider}&offer={offer.offer_id}"
                        f"&bid={int(offer.is_bid)}")


class InstanceEventInline(admin.TabularInline):
    model = InstanceEvent
    extra = 0
    can_delete = False
    readonly_fields = ["at", "kind", "message"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["label", "state", "provider", "provider_instance_id", "gpu_name", "usd_per_hour",
                    "requested_at", "keep_until"]
    list_filter = ["state", "provider", "purpose", "is_bid"]
    search_fields = ["label", "provider_instance_id", "offer_id"]
    readonly_fields = [f.name for f in Instance._meta.fields if f.name != "keep_until"]
    inlines = [InstanceEventInline]
    actions = ["destroy"]

    def has_add_permission(self, request):
        return False  # instances are rented through the Rent confirmation, never typed in

    def has_destroy_permission(self, request):
        return can(request.user, "fleet.destroy_instance")

    @admin.action(description="Destroy the selected instances…", permissions=["destroy"])
    def destroy(self, request, queryset):
        live = queryset.filter(state__in=Instance.LIVE_STATES)
        if request.POST.get("confirmed") == "yes":
            reason = f"destroyed by {request.user.get_username()} from the admin"
            for instance in live:
                enqueue.destroy_instance(instance.pk, reason, True)
            self.message_user(request, f"Destroying {live.count()} instance(s).", messages.SUCCESS)
            return None
        return TemplateResponse(request, "admin/fleet/destroy_confirm.html", {
            **self.admin_site.each_context(request), "title": "Destroy instances?", "instances": live,
            "queryset": queryset, "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        })


@admin.register(OfferRefresh)
class OfferRefreshAdmin(admin.ModelAdmin):
    list_display = ["provider", "started_at", "finished_at", "offers_seen", "offers_skipped", "error"]
    list_filter = ["provider"]


admin.site.register(OfferProfile)
admin.site.register(ThroughputCalibration)
admin.site.register(Alert)
