"""The disk a run's box is rented with, worked out from its model (weights, checkpoints, image, headroom), never typed;
a person may rent more, never less. Pure (docs/fleet.md, "fleet/instances/disk.py")."""

import math
from dataclasses import dataclass

from fleet.ranking import Workload

HEADROOM_FRACTION = 0.2
HEADROOM_MIN_GB = 10.0
CHECKPOINTS_BESIDE_KEPT = 2  # the one being written and the one restored from
# A checkpoint holds at most every trained value in fp32 with its gradient and Adam's two moments.
BYTES_PER_TRAINED_PARAMETER = 16
MIN_CHECKPOINT_GB = 0.01  # its own small files: the manifest, the trainer's state, the tokenizer


@dataclass(frozen=True)
class DiskNeed:
    model: str  # what the weights figure is for, in words
    weights_gb: float
    checkpoints: int
    checkpoint_gb: float
    image_gb: float

    @property
    def headroom_gb(self) -> float:
        return max(HEADROOM_MIN_GB, HEADROOM_FRACTION * self._contents_gb)

    @property
    def total_gb(self) -> int:
        return math.ceil(self._contents_gb + self.headroom_gb)

    @property
    def _contents_gb(self) -> float:
        return self.weights_gb + self.checkpoints * self.checkpoint_gb + self.image_gb

    def __str__(self) -> str:
        weights = f"the weights of {self.model} {self.weights_gb:g} GB" if self.weights_gb else \
            f"no weights to download ({self.model})"
        return (f"{self.total_gb} GB: {weights}, {self.checkpoints} checkpoints of {self.checkpoint_gb:g} GB, the "
                f"image {self.image_gb:g} GB and {self.headroom_gb:.0f} GB of headroom")


def needed(figures: Workload, *, keep: int, built_from_config: bool = False,
           listed_weights_gb: float | None = None) -> DiskNeed:
    """What a box needs for a run whose model the ranking knows by `figures` (the recipe it ranks the run with),
    keeping `keep` checkpoints."""
    if built_from_config:
        model, weights = "a model built from its config on the box", 0.0
    else:
        model, weights = figures.model, float(figures.model_download_gb)
        if listed_weights_gb is not None and listed_weights_gb > weights:
            model, weights = f"{figures.model} as listed", round(listed_weights_gb, 1)
    return DiskNeed(model=model, weights_gb=weights, checkpoints=keep + CHECKPOINTS_BESIDE_KEPT,
                    checkpoint_gb=float(figures.checkpoint_gb), image_gb=float(figures.image_gb))


def config_parameters(config: dict) -> int | None:
    """The parameter count of a transformers config's decoder (dense or mixture of experts), from its shapes; None
    when the config does not give them."""
    try:
        hidden, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        experts = int(config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
                      or 0)
        if experts:
            expert_size = int(config.get("moe_intermediate_size") or config["intermediate_size"])
            shared = int(config.get("shared_expert_intermediate_size") or 0) + \
                int(config.get("n_shared_experts") or 0) * expert_size
            mlp = 3 * hidden * (experts * expert_size + shared) + experts * hidden  # the experts and the router
        else:
            mlp = 3 * hidden * int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    attention = hidden * head_dim * 2 * (heads + kv_heads)  # q and o; k and v
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return embeddings + layers * (attention + mlp + 2 * hidden) + hidden  # and the norms


def built_model_checkpoint_gb(config: dict, lora_rank: int) -> float | None:
    """At most what a checkpoint of a model built from `config` on the box takes: its adapters of rank `lora_rank`
    with their optimizer state, bounded by the whole model's parameters (more where the rank outgrows the
    smallest of its shapes); None when the config does not give its shapes."""
    parameters = config_parameters(config)
    if parameters is None:
        return None
    hidden = int(config["hidden_size"])
    narrowest = min(hidden, int(config.get("moe_intermediate_size") or config.get("intermediate_size") or hidden),
                    int(config.get("head_dim") or hidden // int(config["num_attention_heads"])))
    trained = parameters * max(1.0, 2 * lora_rank / narrowest)
    return max(MIN_CHECKPOINT_GB, round(trained * BYTES_PER_TRAINED_PARAMETER / 1e9, 3))


def chosen_disk_gb(need: DiskNeed, asked_gb: int | None) -> int:
    """The disk to rent: what was asked for when it holds the need, the need when nothing was asked; ValueError
    when the ask is below the need."""
    if asked_gb is None:
        return need.total_gb
    if asked_gb < need.total_gb:
        raise ValueError(f"At least {need}.")
    return asked_gb
