from django.db import models

from fleet.models.events import Event
from runs import lifecycle, wording


class Run(models.Model):
    """A fine-tune of several phases that the product carries through host failures to the end."""

    # The state machine's states (runs.lifecycle) as choices: Run.State.FINISHED == lifecycle.FINISHED.
    State = models.TextChoices("State", [(state.upper(), state) for state in lifecycle.STATES], module=__name__,
                               qualname="Run.State")
    ACTIVE_STATES = lifecycle.ACTIVE

    name = models.CharField(max_length=100)
    recipe = models.JSONField(help_text="the training recipe (training.recipe), as the box receives it")
    profile = models.ForeignKey("fleet.OfferProfile", null=True, blank=True, on_delete=models.SET_NULL,
                                help_text="how offers are ranked for this run; the defaults when empty")
    bucket = models.CharField(max_length=300, help_text="where checkpoints go: s3://bucket/prefix or a local path")
    budget_usd = models.DecimalField(max_digits=10, decimal_places=2)
    max_restarts = models.PositiveSmallIntegerField(default=3)
    disk_gb = models.PositiveIntegerField(null=True, blank=True, help_text="the disk each of its boxes is rented "
                                          "with: at least what its model needs (fleet.instances.disk)")
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    state_reason = models.TextField(blank=True)
    restarts = models.PositiveSmallIntegerField(default=0)
    token_nonce = models.CharField(max_length=32, help_text="part of the signed agent token; a new one revokes the old")
    current_instance = models.ForeignKey("fleet.Instance", null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="+")
    bad_machines = models.JSONField(default=list, blank=True, help_text="hosts this run will not be rented on again")
    volume = models.JSONField(default=dict, blank=True, help_text="the provider's volume its boxes mount, where the "
                              "base model is kept between boxes ({provider, id, name, mount_path, size_gb, "
                              "machine_id, data_center_id, storage_usd_per_gb_month}); empty: none")
    current_phase = models.PositiveSmallIntegerField(default=0)
    current_step = models.PositiveIntegerField(default=0)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_step_at = models.DateTimeField(null=True, blank=True)
    credentials_renewed_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    wound_up_at = models.DateTimeField(null=True, blank=True, help_text="box destroyed and alert sent, once")
    promoted = models.BooleanField(null=True, blank=True, help_text="the latest evaluation's verdict by the recipe's "
                                   "promote rule; none: never evaluated")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state"])]
        permissions = [("launch_run", "Can launch and cancel training runs")]

    def __str__(self):
        return f"{self.name} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES

    @property
    def shown_state(self) -> str:
        return lifecycle.shown_state(self.state, self.restarts, self._box_state)

    @property
    def state_words(self) -> str:
        """The state in the few words a page shows: what is happening to the run's box (runs.wording)."""
        return wording.state_words(self.state, self.restarts, self._box_state)

    @property
    def _box_state(self) -> str | None:
        return self.current_instance.state if self.current_instance_id else None


class DataSet(models.Model):
    """A phase's JSONL as it was checked and stored: kept once per content in its bucket, and reused by name only by
    a launch of someone who stored it there under that name (DataSetName). `name` and `uploaded_by` are its first
    upload's."""

    name = models.CharField(max_length=200, help_text="the uploaded file's name, or the s3:// object it came from")
    kind = models.CharField(max_length=10, help_text="the phase kind it was checked for: cpt, sft, dpo, kto, grpo")
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    rows = models.PositiveIntegerField()
    bucket = models.CharField(max_length=300, help_text="the bucket it was stored in, as the run gave it")
    uri = models.CharField(max_length=500,
                           help_text="its folder: s3://bucket/prefix/datasets/<sha256>/ or a local path")
    report = models.JSONField(default=dict, blank=True,
                              help_text="what the check measured: tokenizer, token counts, a rendered sample")
    uploaded_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField()

    FILE_NAME = "data.jsonl"  # the one file under uri

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["bucket", "sha256", "kind"], name="one_dataset_per_content")]

    def __str__(self):
        return f"{self.name} ({self.kind}, {self.sha256[:12]})"


class DataSetName(models.Model):
    """A name one user stored a data set under: what a later launch of theirs finds by `data: <name>`, and no one
    else's (docs/runs.md, "runs/datasets.py")."""

    dataset = models.ForeignKey(DataSet, on_delete=models.CASCADE, related_name="names")
    user = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.CASCADE,
                             help_text="who stored it under this name; none: a launch by the product")
    name = models.CharField(max_length=200, help_text="the uploaded file's name, or the s3:// object it came from")
    stored_at = models.DateTimeField(help_text="the last launch that stored it under this name")

    class Meta:
        ordering = ["-stored_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["dataset", "user", "name"], name="one_name_per_user")]

    def __str__(self):
        return f"{self.name} ({self.dataset_id}, {self.user_id})"


class Phase(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="phases")
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=40)
    kind = models.CharField(max_length=10)
    steps = models.PositiveIntegerField()
    dataset = models.ForeignKey(DataSet, null=True, blank=True, on_delete=models.PROTECT, related_name="phases",
                                help_text="the data the box downloads for this phase (none: a run older than data "
                                          "sets, whose box reads the recipe's path)")
    eval_dataset = models.ForeignKey(DataSet, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                     help_text="the held-out data the box validates this phase on (its recipe's "
                                               "eval_data), if any")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="unique_phase_index")]


class RunAttempt(models.Model):
    """One box a run trained on: the run's cost is the sum of its attempts' instances."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    instance = models.ForeignKey("fleet.Instance", on_delete=models.PROTECT, related_name="run_attempts")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.TextField(blank=True)
    token_nonce = models.CharField(max_length=32, blank=True,
                                   help_text="part of this box's signed agent token: it opens this attempt only")
    token_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="the box's token stops opening anything then; heartbeats renew it")
    uploads_deleted_at = models.DateTimeField(
        null=True, blank=True, help_text="its attempt folder in the store was emptied then, its upload grants expired")
    evaluation = models.ForeignKey("runs.Evaluation", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="attempts", help_text="the evaluate-again this box was rented for: "
                                                                      "its cost is that evaluation's, not training's")

    class Meta:
        ordering = ["started_at", "id"]


class ModelGrant(models.Model):
    """An s3:// base model's read grant (or its refusal) as signed for one attempt, answered again while it lasts
    (runs.model_grants): its presigned GETs open the model's files until `expires_at`."""

    attempt = models.OneToOneField(RunAttempt, on_delete=models.CASCADE, related_name="model_grant")
    uri = models.TextField(help_text="the recipe's model.path it was signed for")
    grant = models.JSONField(help_text="the spec's model, as the box receives it")
    expires_at = models.DateTimeField(help_text="its presigned GETs stop working then")


class ModelManifest(models.Model):
    """A base model's files as the dashboard itself read them, with their sizes and sha256 (runs.model_manifests):
    an s3:// model's every file, a hub model's weights (its LFS files, by the hub's own sha256, at one commit). What a
    box checks a volume's copy of the model against before it skips the download."""

    uri = models.CharField(max_length=1000, unique=True,
                           help_text="the model's s3://bucket/prefix, or hub:owner/name@revision")
    revision = models.CharField(max_length=64, blank=True, help_text="a hub model: the commit the manifest is of")
    files = models.JSONField(default=dict, help_text="{name: size} as listed when the recording began")
    manifest = models.JSONField(default=dict, blank=True, help_text="{name: {size, sha256}} of the files hashed so far")
    complete = models.BooleanField(default=False, help_text="every listed file is hashed")
    started_at = models.DateTimeField()
    recorded_at = models.DateTimeField(null=True, blank=True)


class VolumeModel(models.Model):
    """A volume a box said holds a base model whose every file matched the dashboard's manifest: the ranking prices
    a box that mounts it without the model's download (the next box checks the files again before using them)."""

    provider = models.CharField(max_length=20)
    volume_id = models.CharField(max_length=100)
    uri = models.CharField(max_length=1000, help_text="the model's reference (model.path)")
    verified_at = models.DateTimeField()
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                            help_text="the run whose box said so")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "volume_id", "uri"], name="one_volume_model")]


class MetricPoint(models.Model):
    """One training step as the box reported it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    phase = models.PositiveSmallIntegerField()
    step = models.PositiveIntegerField()
    at = models.DateTimeField()
    loss = models.FloatField(null=True)
    lr = models.FloatField(null=True)
    step_s = models.FloatField(null=True)
    tokens_per_s = models.FloatField(null=True)
    grad_norm_routed = models.FloatField(null=True)
    grad_norm_attention = models.FloatField(null=True)
    grad_norm_linear_attention = models.FloatField(null=True)
    grad_norm_shared_expert = models.FloatField(null=True)
    grad_norm_total = models.FloatField(null=True)
    routed_b_norm = models.FloatField(null=True)
    routed_b_zero = models.PositiveIntegerField(null=True)
    router_max_mean = models.FloatField(null=True)
    router_idle_experts = models.PositiveIntegerField(null=True)
    gpu_mem_gib = models.FloatField(null=True)
    kernel_path = models.CharField(max_length=20, blank=True)
    # Each phase kind's own figures and the held-out ones (training/metric_fields.py PHASE_KIND_FIELDS,
    # HELD_OUT_FIELDS): only the steps of a phase of that kind have them, the held-out ones at its validations.
    rewards_chosen = models.FloatField(null=True)
    rewards_rejected = models.FloatField(null=True)
    rewards_accuracy = models.FloatField(null=True)
    rewards_margin = models.FloatField(null=True)
    kl = models.FloatField(null=True)
    reward_mean = models.FloatField(null=True)
    reward_std = models.FloatField(null=True)
    completion_length = models.FloatField(null=True)
    zero_spread_groups = models.FloatField(null=True)
    eval_loss = models.FloatField(null=True)
    eval_perplexity = models.FloatField(null=True)
    eval_rewards_chosen = models.FloatField(null=True)
    eval_rewards_rejected = models.FloatField(null=True)
    eval_rewards_accuracy = models.FloatField(null=True)
    eval_rewards_margin = models.FloatField(null=True)
    eval_reward_mean = models.FloatField(null=True)
    eval_reward_std = models.FloatField(null=True)
    eval_s = models.FloatField(null=True)
    instance = models.ForeignKey("fleet.Instance", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "phase", "step"], name="one_point_per_step")]
        indexes = [models.Index(fields=["run", "at"])]


class RouterLoad(models.Model):
    """The router's load over one logging interval of a phase, as the box counted it: (token, choice) pairs each
    routed expert received, one row per MoE layer (runs.router_loads keeps the newest few per phase)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="router_loads")
    phase = models.PositiveSmallIntegerField()
    step = models.PositiveIntegerField(help_text="the interval's last step")
    at = models.DateTimeField()
    counts = models.JSONField(help_text="[[count of expert 0, 1, ...] of MoE layer 0, ...], non-negative integers")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "phase", "step"], name="one_router_load_per_step")]


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    phase = models.PositiveSmallIntegerField()
    step = models.PositiveIntegerField()
    uri = models.CharField(max_length=500)
    complete = models.BooleanField(default=False, help_text="its completion marker was written")
    size_bytes = models.BigIntegerField(null=True, blank=True)
    manifest = models.JSONField(null=True, blank=True,
                                help_text="{file name: {size, sha256}} as recorded when it was declared complete; a "
                                          "box loads it only if every file matches")
    rejected_reason = models.TextField(blank=True, help_text="why a box refused to load it: it is never resumed from")
    pruned_at = models.DateTimeField(null=True, blank=True,
                                     help_text="deleted from the store then (beyond the recipe's keep count)")
    written_by = models.ForeignKey(RunAttempt, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                   help_text="the attempt whose upload was checked against the manifest")
    written_etags = models.JSONField(null=True, blank=True,
                                     help_text="{file name: ETag} listed when it was declared complete: the seal "
                                               "copies exactly those objects")
    sealed_at = models.DateTimeField(null=True, blank=True,
                                     help_text="copied then to the run's sealed folder, where no box can write; only "
                                               "a sealed checkpoint is resumed from or served")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-phase", "-step"]
        constraints = [models.UniqueConstraint(fields=["run", "phase", "step"], name="one_checkpoint_per_step")]


class Evaluation(models.Model):
    """One evaluation of a run's banked adapter against its base model: number 0 is the recipe's eval phase, 1 and on
    each "evaluate again" (docs/runs.md, "Evaluation"). Its summary is computed here from the samples recorded."""

    class State(models.TextChoices):
        WAITING = "waiting"  # asked for; no box has started it
        RUNNING = "running"
        FINISHED = "finished"
        FAILED = "failed"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="evaluations")
    number = models.PositiveSmallIntegerField(help_text="0: the recipe's eval phase; 1, 2, ...: evaluate again")
    phase = models.PositiveSmallIntegerField(help_text="the eval phase's index in the recipe its box receives: after "
                                                       "the training phases")
    settings = models.JSONField(help_text="the eval phase as checked: data, scorer, max_new_tokens, max_samples, ...")
    dataset = models.ForeignKey(DataSet, null=True, blank=True, on_delete=models.PROTECT, related_name="evaluations")
    samples_expected = models.PositiveIntegerField(help_text="the eval file's records, or its max_samples cut")
    budget_usd = models.DecimalField(max_digits=10, decimal_places=2, null=True, blank=True,
                                     help_text="evaluate again only: what its own boxes may cost")
    state = models.CharField(max_length=10, choices=State.choices, default=State.WAITING)
    reason = models.TextField(blank=True, help_text="why it failed, or the promote rule's words")
    base_score = models.FloatField(null=True, blank=True)
    adapter_score = models.FloatField(null=True, blank=True)
    difference = models.FloatField(null=True, blank=True)
    ci_low = models.FloatField(null=True, blank=True, help_text="95% paired-bootstrap interval of the difference")
    ci_high = models.FloatField(null=True, blank=True)
    wins = models.PositiveIntegerField(null=True, blank=True)
    ties = models.PositiveIntegerField(null=True, blank=True)
    losses = models.PositiveIntegerField(null=True, blank=True)
    promoted = models.BooleanField(null=True, blank=True)
    generated_with = models.CharField(max_length=20, blank=True, help_text="vllm or transformers")
    tokens_per_s = models.FloatField(null=True, blank=True)
    requested_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    evaluated_alert = models.ForeignKey("fleet.Alert", null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    promoted_alert = models.ForeignKey("fleet.Alert", null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="+")

    class Meta:
        ordering = ["number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="one_evaluation_per_number")]

    def __str__(self):
        return f"evaluation {self.number} of run {self.run_id} ({self.state})"


class EvalSample(models.Model):
    """One prompt of an evaluation, as the box answered and scored it with and without the adapter; the first post of
    an index is kept."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="samples")
    index = models.PositiveIntegerField()
    prompt = models.TextField()
    expected = models.TextField(blank=True)
    base_answer = models.TextField()
    adapter_answer = models.TextField()
    base_score = models.FloatField()
    adapter_score = models.FloatField()
    recorded_at = models.DateTimeField()

    class Meta:
        ordering = ["index"]
        constraints = [models.UniqueConstraint(fields=["evaluation", "index"], name="one_sample_per_index")]


class RunEvent(Event):
    """Every transition of a run, and everything its box reported, with the reason."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")


class Pulse(models.Model):
    """When a part of the control plane last finished a pass (the supervisor): a box's heartbeat answer depends on it,
    so boxes stop themselves when nothing watches them any more."""

    name = models.CharField(max_length=40, unique=True)
    at = models.DateTimeField()

    def __str__(self):
        return f"{self.name} at {self.at:%Y-%m-%d %H:%M:%S}"
