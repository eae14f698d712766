from django.db import models


class InferenceModel(models.Model):
    """A model the inference fleet serves, and how many replicas of it should be up."""

    name = models.CharField(max_length=200, unique=True, help_text="as /v1/models lists it")
    desired_replicas = models.PositiveSmallIntegerField(default=1)
    image = models.CharField(max_length=300, help_text="the serving image (vLLM)")
    port = models.PositiveIntegerField(default=8000, help_text="the container port that serves /v1/models")
    profile = models.ForeignKey("fleet.OfferProfile", null=True, blank=True, on_delete=models.SET_NULL,
                                help_text="how replacement boxes are ranked; the defaults when empty")
    max_replacements_per_day = models.PositiveSmallIntegerField(default=3, help_text="the replacement budget")
    # A fine-tuned adapter served on its base: vLLM runs the base with --enable-lora and lists the adapter under the
    # model's name. The box reads the files through a read grant made when it is rented, and checks each against the
    # manifest recorded when the checkpoint was declared complete before vLLM starts.
    base_model = models.CharField(max_length=300, blank=True,
                                  help_text="the model vLLM loads under the adapter; empty: the name is the model")
    base_revision = models.CharField(max_length=200, blank=True,
                                     help_text="the base's hub branch, tag or commit the adapter was trained on")
    adapter_uri = models.CharField(max_length=600, blank=True,
                                   help_text="the folder of the adapter's files: s3://bucket/prefix/... "
                                             "or a local path")
    adapter_manifest = models.JSONField(default=dict, blank=True,
                                        help_text="{file name: {size, sha256}} of the adapter's files")
    adapter_source = models.CharField(max_length=300, blank=True, help_text="the run and checkpoint it comes from")
    vram_needed_gb = models.FloatField(null=True, blank=True,
                                       help_text="per GPU, what offers are ranked with; empty: the profile's recipe")
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL,
                                   help_text="its owner: only they and operators see it (none: operators only)")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return self.name

    @property
    def serves_adapter(self) -> bool:
        return bool(self.adapter_uri)


class ProbeResult(models.Model):
    """One probe of a serving box's /v1/models."""

    instance = models.ForeignKey("fleet.Instance", on_delete=models.CASCADE, related_name="probes")
    at = models.DateTimeField()
    ok = models.BooleanField()
    latency_ms = models.FloatField(null=True, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    models_served = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["instance", "-at"])]
