from dataclasses import fields

from django.db import models

from fleet.providers.records import OfferRecord

_OFFER_FIELDS = [f.name for f in fields(OfferRecord)]


class Offer(models.Model):
    """The latest listing of one marketplace offer, as the last refresh saw it."""

    provider = models.CharField(max_length=20)
    offer_id = models.CharField(max_length=40)
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
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    available = models.BooleanField(default=True, help_text="listed in the latest refresh")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "offer_id", "is_bid"], name="unique_offer")]
        indexes = [models.Index(fields=["available", "total_usd_per_hour"])]

    def __str__(self):
        return f"{self.provider} {self.offer_id}: {self.num_gpus}x {self.gpu_name} ${self.total_usd_per_hour}/h"

    @classmethod
    def field_values(cls, record: OfferRecord) -> dict:
        return {name: getattr(record, name) for name in _OFFER_FIELDS}

    def to_record(self) -> OfferRecord:
        return OfferRecord(**{name: getattr(self, name) for name in _OFFER_FIELDS})

    @property
    def location(self) -> str:
        return self.geolocation or "unknown"


class OfferRefresh(models.Model):
    """One refresh of a marketplace's offers: when, how many, and what went wrong, for the Offers page."""

    provider = models.CharField(max_length=20)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)
    offers_seen = models.PositiveIntegerField(default=0)
    offers_skipped = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        get_latest_by = "started_at"
        indexes = [models.Index(fields=["provider", "-started_at"])]


class OfferProfile(models.Model):
    """A saved recipe and set of filters, so a user ranks offers for the same run the same way every time."""

    name = models.SlugField(max_length=60, unique=True)
    recipe = models.JSONField(help_text="fleet.ranking.Recipe.to_dict()")
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


class Instance(models.Model):
    """A machine we rented (or asked to rent). The row is written before the provider is called, so a worker that
    dies mid-call leaves something for the next sync to reconcile by label."""

    class State(models.TextChoices):
        REQUESTED = "requested"
        PROVISIONING = "provisioning"
        RUNNING = "running"
        STOPPING = "stopping"
        DESTROYED = "destroyed"
        FAILED = "failed"

    LIVE_STATES = (State.REQUESTED, State.PROVISIONING, State.RUNNING, State.STOPPING)
    BILLING_STATES = (State.PROVISIONING, State.RUNNING, State.STOPPING)

    provider = models.CharField(max_length=20)
    provider_instance_id = models.CharField(max_length=40, null=True, blank=True)
    idempotency_key = models.CharField(max_length=64, unique=True)
    label = models.CharField(max_length=80, blank=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.REQUESTED)
    purpose = models.CharField(max_length=20, default="manual", help_text="manual, training or serving")
    # What was asked for
    offer_id = models.CharField(max_length=40)
    gpu_name = models.CharField(max_length=80)
    num_gpus = models.PositiveSmallIntegerField(default=1)
    image = models.CharField(max_length=300)
    disk_gb = models.PositiveIntegerField()
    is_bid = models.BooleanField(default=False)
    bid_usd_per_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    requested_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL)
    requested_at = models.DateTimeField()
    rent_attempted_at = models.DateTimeField(null=True, blank=True)
    # What the provider reports
    provider_status = models.CharField(max_length=40, blank=True)
    status_msg = models.TextField(blank=True)
    usd_per_hour = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    gpu_util_percent = models.FloatField(null=True, blank=True)
    public_ip = models.CharField(max_length=64, blank=True)
    ports = models.JSONField(default=dict, blank=True)
    ssh_host = models.CharField(max_length=200, blank=True)
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="billing start, as the provider reports it")
    running_at = models.DateTimeField(null=True, blank=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    # Teardown
    failure_reason = models.TextField(blank=True)
    keep_until = models.DateTimeField(null=True, blank=True, help_text="kept for debugging until then, not after")
    destroy_reason = models.TextField(blank=True)
    destroy_requested_at = models.DateTimeField(null=True, blank=True)
    destroy_attempts = models.PositiveSmallIntegerField(default=0)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="billing end: destroyed or gone")
    # Cost
    traffic_usd = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    provider_charged_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    charges_reconciled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "provider_instance_id"], name="unique_provider_instance",
                                    condition=models.Q(provider_instance_id__isnull=False)),
        ]
        indexes = [models.Index(fields=["state"])]
        permissions = [("rent_instance", "Can rent instances"), ("destroy_instance", "Can destroy instances")]

    def __str__(self):
        return f"{self.label or self.pk} ({self.num_gpus}x {self.gpu_name}, {self.state})"

    @property
    def is_live(self) -> bool:
        return self.state in self.LIVE_STATES


class CostSegment(models.Model):
    """A stretch of time an instance billed at one hourly price; the ledger is the sum of these (plus traffic)."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="cost_segments")
    usd_per_hour = models.DecimalField(max_digits=12, decimal_places=6)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["ended_at"]), models.Index(fields=["started_at"])]


class InstanceEvent(models.Model):
    """What happened to an instance and why, in words a user reads on its page."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=40)
    message = models.TextField()

    class Meta:
        ordering = ["-at", "-id"]


class Alert(models.Model):
    """Something a person should know; webhook deliveries hang off these."""

    kind = models.CharField(max_length=40)
    message = models.TextField()
    instance = models.ForeignKey(Instance, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
