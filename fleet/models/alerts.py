from django.db import models


class Alert(models.Model):
    """Something a person should know. Written first; webhook deliveries hang off it."""

    class Kind(models.TextChoices):
        INSTANCE_RENTED = "instance.rented"
        INSTANCE_DESTROYED = "instance.destroyed"
        INSTANCE_FAILED = "instance.failed"
        INSTANCE_REAPED = "instance.reaped"
        INSTANCE_ADOPTED = "instance.adopted"
        DESTROY_UNCONFIRMED = "instance.destroy_unconfirmed"
        PROVIDER_FAILING = "provider.failing"  # a marketplace's sync keeps failing: its boxes bill unwatched
        PROBE_FAILING = "probe.failing"
        SPEND_CAP_HIT = "spend_cap.hit"
        RUN_RECOVERING = "run.recovering"  # its box was lost or hung: it resumes on a new one
        RUN_FAILED = "run.failed"
        RUN_FINISHED = "run.finished"
        RUN_CANCELLED = "run.cancelled"  # an operator stopped it: not a failure
        RUN_EVALUATED = "run.evaluated"  # its adapter was scored against the base model: the numbers and the verdict
        RUN_PROMOTED = "run.promoted"  # the evaluation passed the recipe's promote rule
        TEST = "test"  # sent from the Alerts page to one endpoint, whatever kinds it takes

    kind = models.CharField(max_length=40, choices=Kind.choices)
    message = models.TextField()
    instance = models.ForeignKey("fleet.Instance", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="alerts")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["kind", "-created_at"])]


class WebhookEndpoint(models.Model):
    """Where alerts are posted, signed as the Standard Webhooks spec says."""

    name = models.CharField(max_length=100)
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200, help_text="whsec_ + base64; shown once when made")
    events = models.JSONField(default=list, blank=True, help_text="alert kinds to send; empty: all")
    slack = models.BooleanField(default=False, help_text="post a Slack-compatible body")
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return self.name

    def wants(self, kind: str) -> bool:
        return self.enabled and (not self.events or kind in self.events)


class WebhookDelivery(models.Model):
    """One alert to one endpoint. The row is written before the first attempt, so a crash leaves it visible."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENDING = "sending"
        RETRYING = "retrying"
        SENT = "sent"
        FAILED = "failed"

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    message_id = models.CharField(max_length=64, unique=True, help_text="webhook-id: the same on every attempt")
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "alert"], name="one_delivery_per_endpoint")]
        indexes = [models.Index(fields=["state", "next_attempt_at"])]
