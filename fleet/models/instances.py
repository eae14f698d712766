from django.db import models

from fleet.models.events import Event


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
    offer_id = models.CharField(max_length=120)  # as long as the offer ids it was rented from
    gpu_name = models.CharField(max_length=80)
    num_gpus = models.PositiveSmallIntegerField(default=1)
    machine_id = models.CharField(max_length=40, blank=True, help_text="the host, so a bad one is not rented again")
    image = models.CharField(max_length=300)
    disk_gb = models.PositiveIntegerField()
    is_bid = models.BooleanField(default=False)
    bid_usd_per_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    volume = models.JSONField(default=dict, blank=True, help_text="the account's volume the box mounts: {id, "
                              "mount_path, data_center_id}; empty: none")
    bid_cap_usd_per_hour = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True,
        help_text="an outbid box raises its bid while the rental stays within this $/h; blank: it moves")
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
    # What the box is doing: heartbeats of its on-box agent and probes of its serving endpoint. The reaper decides
    # from these; None means never seen.
    serving_model = models.ForeignKey("fleet.InferenceModel", null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="replicas")
    replaces = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replaced_by",
                                 help_text="the instance this one took over from (a move or a replacement)")
    last_process_at = models.DateTimeField(null=True, blank=True, help_text="a training or serving process seen")
    last_step_at = models.DateTimeField(null=True, blank=True, help_text="training made step progress")
    gpu_last_ok_at = models.DateTimeField(null=True, blank=True, help_text="the GPU last answered the agent")
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_latency_ms = models.FloatField(null=True, blank=True)
    models_served = models.JSONField(default=list, blank=True)
    consecutive_probe_failures = models.PositiveIntegerField(default=0)
    reaped_at = models.DateTimeField(null=True, blank=True)
    reap_reason = models.TextField(blank=True)
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
        permissions = [("rent_instance", "Can rent instances"), ("destroy_instance", "Can destroy instances"),
                       ("operator", "Operator: sees and acts on every user's runs, data sets and inference models")]

    def __str__(self):
        return f"{self.label or self.pk} ({self.num_gpus}x {self.gpu_name}, {self.state})"

    @property
    def is_live(self) -> bool:
        return self.state in self.LIVE_STATES

    @property
    def is_billing(self) -> bool:
        return self.state in self.BILLING_STATES


class CostSegment(models.Model):
    """A stretch of time an instance billed at one hourly price; the ledger is the sum of these (plus traffic)."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="cost_segments")
    usd_per_hour = models.DecimalField(max_digits=12, decimal_places=6)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["ended_at"]), models.Index(fields=["started_at"])]


class InstanceEvent(Event):
    """What happened to an instance and why, in words a user reads on its page."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
