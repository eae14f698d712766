from django.contrib import admin

from fleet.models import Offer, OfferRefresh


@admin.register(Offer)
class OfferAdmin(admin.ModelAdmin):
    list_display = ["offer_id", "gpu_name", "num_gpus", "gpu_ram_gb", "total_usd_per_hour", "reliability",
                    "geolocation", "is_bid", "available", "last_seen_at"]
    list_filter = ["provider", "available", "is_bid", "verified", "gpu_name"]
    search_fields = ["offer_id", "gpu_name", "geolocation", "machine_id"]

    def has_add_permission(self, request):
        return False  # offers come from the marketplace, not from people

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(OfferRefresh)
class OfferRefreshAdmin(admin.ModelAdmin):
    list_display = ["provider", "started_at", "finished_at", "offers_seen", "offers_skipped", "error"]
    list_filter = ["provider"]
