from dataclasses import fields

from django.db import models

from fleet.providers.records import OfferRecord
from fleet.ranking import OfferPrices, offer_prices

_OFFER_FIELDS = [f.name for f in fields(OfferRecord)]
# The float twins of the prices (fleet.ranking.OfferPrices), a column each, in its order.
PRICE_FLOAT_FIELDS = [f"{name}_float" for name in OfferPrices._fields]


class Offer(models.Model):
    """The latest listing of one marketplace offer, as the last refresh saw it."""

    provider = models.CharField(max_length=20)
    # RunPod's offer id is its GPU type id, cloud and count: "NVIDIA RTX PRO 6000 Blackwell Server Edition:SECURE:1"
    offer_id = models.CharField(max_length=120)
    machine_id = models.CharField(max_length=40, blank=True)
    host_id = models.CharField(max_length=40, blank=True)
    gpu_name = models.CharField(max_length=80)
    num_gpus = models.PositiveSmallIntegerField()
    gpu_ram_gb = models.FloatField(help_text="per GPU")
    compute_capability = models.PositiveSmallIntegerField(help_text="90 for sm_90")
    cuda_max = models.FloatField()
    driver_version = models.CharField(max_length=40, blank=True)
    disk_gb = models.FloatField()
    inet_up_mbps = models.FloatField()
    inet_down_mbps = models.FloatField()
    inet_up_usd_per_gb = models.DecimalField(max_digits=12, decimal_places=6)
    inet_down_usd_per_gb = models.DecimalField(max_digits=12, decimal_places=6)
    storage_usd_per_gb_month = models.DecimalField(max_digits=12, decimal_places=6)
    gpu_usd_per_hour = models.DecimalField(max_digits=12, decimal_places=6)
    total_usd_per_hour = models.DecimalField(max_digits=12, decimal_places=6)
    min_bid_usd_per_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    reliability = models.FloatField()
    verified = models.BooleanField()
    rentable = models.BooleanField()
    is_bid = models.BooleanField()
    geolocation = models.CharField(max_length=80, blank=True)
    dlperf = models.FloatField(null=True, blank=True)
    total_flops = models.FloatField(null=True, blank=True)
    nvlink_gb_s = models.FloatField(null=True, blank=True, help_text="GB/s between its GPUs over NVLink; 0: PCIe only")
    pcie_gb_s = models.FloatField(null=True, blank=True, help_text="GB/s of each GPU's PCIe link")
    datacenter = models.BooleanField(null=True, blank=True, help_text="a datacenter host; blank: not said")
    gpu_mem_bw_gb_s = models.FloatField(null=True, blank=True, help_text="each GPU's memory bandwidth, GB/s")
    cpu_ram_gb = models.FloatField(null=True, blank=True, help_text="the host memory the rental gets; blank: not said")
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    available = models.BooleanField(default=True, help_text="listed in the latest refresh")
    # Written with the Decimals by each refresh, so that ranking thousands of offers converts no Decimal; the money a
    # page shows is still worked out from the Decimals.
    usd_per_hour_float = models.FloatField(help_text="gpu_usd_per_hour, or total_usd_per_hour without one")
    storage_usd_per_gb_month_float = models.FloatField()
    inet_down_usd_per_gb_float = models.FloatField()
    inet_up_usd_per_gb_float = models.FloatField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "offer_id", "is_bid"], name="unique_offer")]
        indexes = [models.Index(fields=["available", "total_usd_per_hour"])]

    def __str__(self):
        return f"{self.provider} {self.offer_id}: {self.num_gpus}x {self.gpu_name} ${self.total_usd_per_hour}/h"

    @classmethod
    def field_values(cls, record: OfferRecord) -> dict:
        """The columns a record fills: its own fields and the float twins of its prices."""
        return {name: getattr(record, name) for name in _OFFER_FIELDS} | dict(
            zip(PRICE_FLOAT_FIELDS, offer_prices(record), strict=True))

    def save(self, *args, **kwargs):
        # A row written through the ORM one at a time (the admin, a script) keeps its float twins in step with its
        # Decimals; bulk writes carry them from field_values.
        for name, value in zip(PRICE_FLOAT_FIELDS, offer_prices(self), strict=True):
            setattr(self, name, value)
        if kwargs.get("update_fields") is not None:
            kwargs["update_fields"] = {*kwargs["update_fields"], *PRICE_FLOAT_FIELDS}
        super().save(*args, **kwargs)

    def to_record(self) -> OfferRecord:
        return OfferRecord(**{name: getattr(self, name) for name in _OFFER_FIELDS})

    def prices(self) -> OfferPrices:
        return OfferPrices(*(getattr(self, name) for name in PRICE_FLOAT_FIELDS))


class OfferRefresh(models.Model):
    """One refresh of a marketplace's offers: when, how many, and what went wrong, for the Offers page."""

    provider = models.CharField(max_length=20)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)
    offers_seen = models.PositiveIntegerField(default=0)
    offers_skipped = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        verbose_name_plural = "offer refreshes"
        get_latest_by = "started_at"
        indexes = [models.Index(fields=["provider", "-started_at"])]


class OfferProfile(models.Model):
    """A saved recipe and set of filters, so a user ranks offers for the same run the same way every time."""

    name = models.SlugField(max_length=60, unique=True)
    recipe = models.JSONField(help_text="fleet.ranking.Workload.to_dict()")
    filters = models.JSONField(help_text="fleet.ranking.OfferFilters.to_dict()")
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL)
    updated_at = models.DateTimeField(auto_now=True)
    last_ranked_at = models.DateTimeField(null=True, blank=True)
    last_ranking = models.JSONField(null=True, blank=True, help_text="the best offers at the last refresh")

    def __str__(self):
        return self.name


class ThroughputCalibration(models.Model):
    """Measured throughput per GPU model and kernel path, folded in from finished runs (over the seeded table)."""

    gpu_model = models.CharField(max_length=80)
    kernel_path = models.CharField(max_length=20)
    model_tflops = models.FloatField(help_text="achieved model TFLOP/s per GPU")
    weight = models.FloatField()
    measured_runs = models.PositiveIntegerField(default=0)
    note = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu_model", "kernel_path"], name="unique_calibration")]

    def __str__(self):
        return f"{self.gpu_model} / {self.kernel_path}: {self.model_tflops:.1f} TFLOP/s"
