"""What a run needs from a box, decided once from its typed recipe and its offer profile: the ranking's view of the
run, the filters its offers must pass, the VRAM each GPU needs and the disk. The supervisor rents and calibrates
with it, the launch sizes the disk with it."""

from dataclasses import dataclass, replace

from fleet import volumes
from fleet.instances import disk
from fleet.models import OfferProfile
from fleet.offers.ranked import run_settings
from fleet.ranking import OfferFilters, Workload, micro_step_vram_gb
from fleet.ranking.memory import plan_run
from runs import model_manifests, serving
from runs.models import Run
from training.memory_plan import MEMORY_PLANS, OPTIMIZERS
from training.recipe import RunRecipe


@dataclass(frozen=True)
class BoxRequest:
    # The profile's model (or the defaults) with the run's own GPUs, batch shape, LoRA rank, disk and VRAM: what the
    # ranking prices the run's steps, downloads and uploads with.
    figures: Workload
    filters: OfferFilters
    keep: int  # checkpoints the store keeps
    built_from_config: bool  # random weights built on the box: nothing to download
    volume: dict | None = None  # the volume its boxes mount (fleet.volumes.pinned): only offers that can are rented

    @classmethod
    def for_run(cls, run: Run) -> "BoxRequest":
        request = cls.build(RunRecipe.from_stored(run.recipe), run.profile, disk_gb=run.disk_gb)
        if not run.volume or volumes.lost(run.volume, run.bad_machines):
            # No volume, or its machine failed: the boxes go anywhere and download the model onto their own disk.
            return request
        request = replace(request, volume=run.volume)
        if model_manifests.holds(run.volume, run.recipe.get("model")):
            # A box that mounts the volume finds the model there, checked: its start-up has no model download.
            request = replace(request, figures=replace(request.figures, model_download_gb=0.0))
        return request

    @classmethod
    def for_evaluation(cls, run: Run) -> "BoxRequest":
        """A box that only evaluates the run's banked adapter: one GPU that holds the base model for inference (BF16
        weights and a KV cache, as serving ranks boxes), or the training's VRAM when the model's size is unknown."""
        request = cls.for_run(run)
        vram_gb = serving.vram_needed_gb(run.recipe)
        figures = replace(request.figures, gpus=1)
        if vram_gb is not None:
            figures = replace(figures, vram_needed_gb=vram_gb)
        return replace(request, figures=figures)

    @classmethod
    def build(cls, recipe: RunRecipe, profile: OfferProfile | None, *, disk_gb: int | None = None) -> "BoxRequest":
        """`recipe` on the boxes `profile` (or the defaults) ranks for; `disk_gb`, once the launch chose it, is both
        priced and required of a host."""
        figures, filters = run_settings(profile)
        if recipe.gpus != figures.gpus:  # the run trains on this many GPUs of one box, whatever its profile ranks for
            figures = replace(figures, gpus=recipe.gpus)
            if profile is None and filters.max_usd_per_hour is not None:  # the default cap is a one-GPU box's
                filters = replace(filters, max_usd_per_hour=filters.max_usd_per_hour * recipe.gpus)
        if disk_gb:  # runs launched before the disk was chosen rent RENT_DISK_GB
            figures = replace(figures, rent_disk_gb=float(disk_gb))
            filters = replace(filters, min_disk_gb=max(filters.min_disk_gb, float(disk_gb)))
        # The run's own memory settings: the memory plan on each card follows them (fleet/ranking/memory.py).
        # (A stored value no launch passes reads as the default.)
        figures = replace(figures, optimizer=recipe.optimizer if recipe.optimizer in OPTIMIZERS else "adamw",
                          gradient_checkpointing=recipe.gradient_checkpointing,
                          memory_plan=recipe.memory_plan if recipe.memory_plan in MEMORY_PLANS else "auto")
        rank = recipe.lora.r
        # A model the memory plan knows is planned at the run's own micro-step and rank (set below); for another, the
        # VRAM grows from the profile's figure at those (micro_step_vram_gb), never below.
        if plan_run(figures) is None:
            vram_gb = micro_step_vram_gb(figures, batch_size=recipe.batch_size, seq_len=recipe.seq_len,
                                         lora_rank=rank)
            if vram_gb != figures.vram_gb:
                figures = replace(figures, vram_needed_gb=vram_gb)
        if rank > figures.lora_rank:
            # A checkpoint is mostly the adapters and their optimizer state, whose size goes with the rank: the
            # profile's figure is for its own rank (r 1024 instead of 32 is 32 times the disk). Never below it.
            figures = replace(figures, checkpoint_gb=round(figures.checkpoint_gb * rank / figures.lora_rank, 1))
        figures = replace(figures, lora_rank=rank, batch_size=recipe.batch_size, grad_accum=recipe.grad_accum,
                          seq_len=recipe.seq_len)
        if recipe.model.config is not None:  # its checkpoints are the size of the model it is, not the profile's
            checkpoint_gb = disk.built_model_checkpoint_gb(recipe.model.config, rank)
            if checkpoint_gb is not None:
                figures = replace(figures, checkpoint_gb=checkpoint_gb)
        return cls(figures=figures, filters=filters, keep=recipe.checkpoint.keep,
                   built_from_config=recipe.model.config is not None)

    @property
    def vram_gb(self) -> float:
        """What each GPU of the box must hold."""
        return self.figures.vram_gb

    @property
    def vram_words(self) -> str:
        each = f"{self.vram_gb:g} GB of VRAM"
        return f"it needs {each} per GPU" if self.figures.gpus == 1 else \
            f"it needs {self.figures.gpus} GPUs with {each} each"

    def disk_need(self, listed_weights_gb: float | None = None) -> disk.DiskNeed:
        """The disk a box needs (fleet.instances.disk), from the same figures the ranking prices the download and
        uploads with; `listed_weights_gb` is the model's files' size where the dashboard could list them."""
        return disk.needed(self.figures, keep=self.keep, built_from_config=self.built_from_config,
                           listed_weights_gb=listed_weights_gb)
