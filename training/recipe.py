"""The recipe: one YAML (or JSON) file of plain values that says everything a run does; its settings and defaults
are the dataclasses on top. `load_recipe` returns it filled in (or RecipeError listing every problem),
`RunRecipe.from_dict` that as typed values, `RunRecipe.from_stored` a run's recipe as the dashboard stored it."""

import importlib
import json
import math
import re
from dataclasses import Field, asdict, dataclass, field, fields, replace
from pathlib import Path

import yaml

from training import model_source
from training.families import target_problems
from training.memory_plan import MEMORY_PLANS, OPTIMIZERS
from training.records import nested_deeper_than


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """Exactly one of path or config."""

    # A folder, a hub id or s3://bucket/prefix; the on-box agent downloads a hub or s3:// model into its disk first
    # (training/model_source.py).
    path: str | None = None
    config: dict | None = None  # {model_type: qwen3_moe, ...}: a transformers config, random weights
    dtype: str = "bfloat16"  # or float32, float16
    seed: int = 0  # the random weights' seed
    tokenizer: str | None = None  # a folder or hub id; none: the model's own (a byte tokenizer for a config)
    revision: str | None = None  # a hub model's branch, tag or commit


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """Routed experts always; routers frozen; the modules per model family are in training/families.py."""

    r: int = 32
    alpha: float = 64
    attention: bool = True  # false drops attention and linear attention
    # {group: [module paths within a decoder layer]} replaces a group's, e.g. {shared_expert: []} leaves it frozen.
    targets: dict | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointSettings:
    store: str = "checkpoints"  # a folder or s3://bucket/prefix
    endpoint_url: str | None = None
    region: str | None = None
    keep: int = 3
    every: int = 50  # steps; a phase's checkpoint_every by default
    staging: str = "checkpoint-staging"  # local snapshots waiting for upload


@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    jsonl: str = "metrics.jsonl"  # the on-box agent tails it and posts each step to the dashboard
    # Steps between reads of the router's load (tokens per expert and layer, training/router_load.py); 0: not counted.
    router_every: int = 10


@dataclass(frozen=True, kw_only=True)
class PhaseSpec:
    """One phase; a kind reads only the settings PHASE_SETTINGS gives it beside the common ones."""

    kind: str  # cpt | sft | dpo | kto | grpo | eval (after every training phase: it trains nothing)
    # A JSONL file (records: training/records.py); on the dashboard a data set's name, an upload's, s3://bucket/key
    # or example:NAME.
    data: str
    steps: int  # an eval phase's is 0: it answers each of its records once
    name: str  # default: the kind
    checkpoint_every: int  # default: checkpoint.every
    lr: float  # default: the run's
    # A floor on each step's wall time, the rest slept: for demos, so a tiny model's phase lasts long enough to watch.
    min_step_seconds: float = 0.0
    reward: str | None = None  # grpo: module:function
    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    num_generations: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    # Held-out data of a training phase (docs/training.md, "Held-out data"): a JSONL file of the phase's kind (the same
    # sources as data), or the share of the phase's records set aside by a seeded hash; validated every eval_every
    # steps (0: only at the phase's end) and always at its end.
    eval_data: str | None = None
    eval_split: float = 0.0
    eval_every: int = 0
    # eval (docs/training.md, "The eval phase"): how answers are scored, how many records, the wall-time limit of
    # the whole evaluation, and the prompts generated at once.
    scorer: str = "exact"  # exact | contains | regex | tool_call | module:function
    max_samples: int = 0  # the file's first this many records; 0: all
    time_limit_s: int = 3600
    batch_size: int = 8


HELD_OUT = ("eval_data", "eval_split", "eval_every")  # every training kind's
MAX_EVAL_SPLIT = 0.5
PHASE_SETTINGS = {  # each kind's own settings, beside the common ones
    "cpt": HELD_OUT, "sft": HELD_OUT, "dpo": ("beta", *HELD_OUT),
    "kto": ("beta", "desirable_weight", "undesirable_weight", *HELD_OUT),
    "grpo": ("num_generations", "max_new_tokens", "temperature", *HELD_OUT),
    "eval": ("scorer", "max_new_tokens", "max_samples", "time_limit_s", "batch_size"),
}
EVAL_KIND = "eval"
KIND_DEFAULTS = {EVAL_KIND: {"max_new_tokens": 256}}  # where a kind's default is not the dataclass's
SCORERS = ("exact", "contains", "regex", "tool_call")  # built in; or a function as 'module:function'
# The recipe's `promote:` rule (training/eval_stats.py applies it): its settings and their defaults.
PROMOTE_DEFAULTS = {"metric": "difference", "min_gain": 0.0, "min_score": None}
PROMOTE_METRICS = ("adapter_score", "difference")


@dataclass(frozen=True, kw_only=True)
class RunRecipe:
    """Everything a run does, as the trainer and the dashboard read it."""

    model: ModelSettings
    lora: LoraSettings = field(default_factory=LoraSettings)
    batch_size: int = 2  # per rank and micro-step
    grad_accum: int = 8
    seq_len: int = 2048
    lr: float = 2.0e-4
    schedule: str = "cosine"  # or linear, constant
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    promote: dict | None = None  # with an eval phase: {metric, min_gain, min_score} (PROMOTE_DEFAULTS)
    gradient_checkpointing: bool = False
    # adamw (float32 moments) | adamw_8bit (8-bit moments, our kernel) | adamw_offload (moments on the host, GPU only)
    # | adamw_8bit_bf16 (8-bit moments, the factors and their gradients in bf16, rounded stochastically)
    # | adamw_offload_bf16 (moments and a float32 copy of the factors on the host, bf16 factors on the GPU)
    optimizer: str = "adamw"
    # auto: on one GPU the trainer takes the fastest plan that fits the memory it finds (training/memory_plan.py),
    # never less frugal than gradient_checkpointing and optimizer say; recipe: those two as they are.
    memory_plan: str = "auto"
    # On a GPU, CPT/SFT/DPO/KTO micro-steps of one shape are captured once and replayed (DPO/KTO rows are then padded
    # to a few lengths, training/data.py).
    cuda_graphs: bool = True
    seed: int = 0
    gpus: int = 1  # the GPUs of one box, one rank each (torchrun: training/distributed.py); not for GRPO yet
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    phases: tuple[PhaseSpec, ...]

    @classmethod
    def from_dict(cls, recipe: dict) -> "RunRecipe":
        """A recipe as `validate` (or `load_recipe`) filled it in, as typed values."""
        plain = {key: value for key, value in recipe.items() if key not in _NESTED}
        return cls(model=ModelSettings(**recipe["model"]), lora=LoraSettings(**recipe["lora"]),
                   checkpoint=CheckpointSettings(**recipe["checkpoint"]), metrics=MetricsSettings(**recipe["metrics"]),
                   phases=tuple(PhaseSpec(**phase) for phase in recipe["phases"]), **plain)

    @classmethod
    def from_stored(cls, stored) -> "RunRecipe":
        """A run's recipe as the dashboard stored it (checked at its launch): what it leaves out, or holds in a shape
        no launch passes, is the default; a phase that cannot be read is left out."""
        stored = stored if isinstance(stored, dict) else {}
        checkpoint = _read(CheckpointSettings, stored.get("checkpoint"))
        promote = stored.get("promote") if isinstance(stored.get("promote"), dict) else None
        run = _read(cls, stored, model=_read(ModelSettings, stored.get("model")),
                    lora=_read(LoraSettings, stored.get("lora")), checkpoint=checkpoint,
                    metrics=_read(MetricsSettings, stored.get("metrics")), phases=(), promote=promote)
        phases = stored.get("phases") if isinstance(stored.get("phases"), list) else []
        return replace(run, phases=tuple(p for p in (_stored_phase(p, run) for p in phases) if p is not None))

    def to_dict(self) -> dict:
        """The filled-in dict `validate` returns for this recipe: the model's path or config, each phase's kind's own
        settings."""
        recipe = asdict(self)
        model = {key: value for key, value in recipe["model"].items() if key in MODEL_DEFAULTS or value is not None}
        return {**{key: recipe[key] for key in DEFAULTS}, "model": model,
                "phases": [_phase_dict(phase) for phase in recipe["phases"]]}


_NESTED = ("model", "lora", "checkpoint", "metrics", "phases")


def _default(f: Field):
    return asdict(f.default_factory()) if callable(f.default_factory) else f.default  # a block of settings, or one


# The defaults as the validator fills them in, taken from the dataclasses above.
DEFAULTS = {f.name: _default(f) for f in fields(RunRecipe) if f.name not in ("model", "phases")}
MODEL_DEFAULTS = {f.name: f.default for f in fields(ModelSettings) if f.name not in ("path", "config")}
PHASE_KINDS = tuple(PHASE_SETTINGS)
PHASE_COMMON = {f.name for f in fields(PhaseSpec)} - {name for own in PHASE_SETTINGS.values() for name in own}
_PHASE_FIELDS = {f.name: f for f in fields(PhaseSpec)}
PHASE_DEFAULTS = {kind: {**{name: _PHASE_FIELDS[name].default for name in own}, **KIND_DEFAULTS.get(kind, {})}
                  for kind, own in PHASE_SETTINGS.items() if own}


def _phase_dict(phase: dict) -> dict:
    own = PHASE_SETTINGS[phase["kind"]]
    return {key: value for key, value in phase.items() if key in PHASE_COMMON or key in own}


def _fits(value, f: Field) -> bool:
    """Whether a stored value has the shape its setting takes; a setting whose default is none is taken as stored."""
    if f.type is bool:
        return isinstance(value, bool)
    if f.type is int:  # a count, or (where the default is 0) a seed or offset
        return isinstance(value, int) and not isinstance(value, bool) and value >= (0 if f.default == 0 else 1)
    if f.type is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if f.type is str:
        return isinstance(value, str) and bool(value)
    return True


def _read(cls, stored, **given):
    """`cls` from a stored mapping, each setting that fits it taken and the rest left to their defaults."""
    stored = stored if isinstance(stored, dict) else {}
    taken = {f.name: stored[f.name] for f in fields(cls)
             if f.name not in given and f.name in stored and _fits(stored[f.name], f)}
    return cls(**taken, **given)


def _stored_phase(stored, run: RunRecipe) -> PhaseSpec | None:
    if not isinstance(stored, dict) or stored.get("kind") not in PHASE_SETTINGS:
        return None
    evaluates = stored["kind"] == EVAL_KIND
    if not _fits(stored.get("data"), _PHASE_FIELDS["data"]) or not (
            _fits(stored.get("steps"), _PHASE_FIELDS["steps"]) or evaluates and stored.get("steps") == 0):
        return None
    own = {key: stored[key] for key in ("name", "checkpoint_every", "lr") if _fits(stored.get(key), _PHASE_FIELDS[key])}
    own.update({key: value for key, value in KIND_DEFAULTS.get(stored["kind"], {}).items()
                if not _fits(stored.get(key), _PHASE_FIELDS[key])})
    if evaluates:
        own["steps"] = 0
    return _read(PhaseSpec, stored, **{"name": stored["kind"], "checkpoint_every": run.checkpoint.every,
                                       "lr": run.lr, **own})


SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("bfloat16", "float32", "float16")
MAX_GPUS = 16

# The largest value each number may take: past these a run is a typing slip (steps: 10**15 would never end, and its
# phase row could not even be stored), not a plan.
LIMITS = {
    "steps": 10_000_000, "checkpoint_every": 10_000_000, "warmup_steps": 10_000_000, "batch_size": 4096,
    "grad_accum": 4096, "seq_len": 1_048_576, "r": 1024, "seed": 2**32 - 1, "num_generations": 256,
    "max_new_tokens": 65_536, "keep": 1000, "every": 10_000_000,
    "lr": 1.0, "alpha": 65_536, "beta": 1000, "temperature": 100, "max_grad_norm": 1e6, "weight_decay": 10,
    "min_lr_ratio": 1.0, "desirable_weight": 1000, "undesirable_weight": 1000, "min_step_seconds": 3600,
    "max_samples": 10_000_000, "time_limit_s": 7 * 24 * 3600, "eval_every": 10_000_000,
}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


MIN_SEQ_LEN = 16
PHASE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")  # a phase's name is a column of 40 and a chart label
REWARD_PACKAGE = "training."  # reward functions are the worker image's own code: no other module is on the box


def load_reward(spec: str):
    """The GRPO reward function a recipe names as 'module:function' (the trainer calls it; the launch check loads
    it the same way, `reward_problem`)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def reward_problem(spec, what: str = "a reward function") -> str:
    """Why a GRPO phase's reward (or an eval phase's scorer) cannot be called on the box, or "": a 'module:function'
    of this package that imports and is callable (checked at launch, not when the phase starts after hours of the
    earlier ones)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        return f"{what} as 'module:function', got {_shown(spec)}"
    module, name = spec.split(":")
    if not module.startswith(REWARD_PACKAGE) or not all(part.isidentifier() for part in module.split(".")) \
            or not name.isidentifier():
        return f"a function of a module under {REWARD_PACKAGE.rstrip('.')} (e.g. training.examples.rewards:" \
               f"contains_answer), got {_shown(spec)}"
    try:
        function = load_reward(spec)
    except ImportError as exc:
        return f"{module} cannot be imported: {exc}"
    except AttributeError:
        return f"{module} has no function {name}"
    return "" if callable(function) else f"{module}.{name} is not a function"


class RecipeError(ValueError):
    """The recipe is not usable; the message lists every problem found."""


# A recipe is a page of settings. These bounds are far above any real one and far below what hurts: YAML anchors
# and aliases let a few lines stand for a billion values (the "billion laughs"), which whatever walks or stores the
# recipe would build out in full.
MAX_RECIPE_CHARS = 256 * 1024
MAX_RECIPE_DEPTH = 32  # mappings and lists inside one another
MAX_RECIPE_VALUES = 100_000  # scalars, mappings and lists, every alias counted as what it stands for
_EVENT_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present: the same events


def parse_recipe_text(text: str, *, as_json: bool = False):
    """YAML (or JSON) text to plain values, within the bounds above. The YAML is measured on its event stream first,
    each alias counted as the size of its anchor, so an alias bomb is refused in the time it takes to read it,
    without building anything."""
    kind = "JSON" if as_json else "YAML"
    if len(text) > MAX_RECIPE_CHARS:
        raise RecipeError(f"the recipe is {len(text):,} characters; at most {MAX_RECIPE_CHARS:,} are read")
    try:
        if as_json:
            return _within_depth(json.loads(text))
        _measure_yaml(text)
        return yaml.safe_load(text)
    except RecipeError:
        raise
    except RecursionError:  # json's decoder, before the depth could be measured
        raise RecipeError(f"the recipe nests more than {MAX_RECIPE_DEPTH} levels deep") from None
    except (ValueError, yaml.YAMLError) as exc:
        raise RecipeError(f"not valid {kind}: {exc}") from None


def _measure_yaml(text: str) -> None:
    anchored: dict[str, int] = {}  # anchor -> the values it stands for
    open_collections: list[list] = []  # [anchor, values so far] for each mapping or list still open
    for event in yaml.parse(text, Loader=_EVENT_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            open_collections.append([event.anchor, 1])
            if len(open_collections) > MAX_RECIPE_DEPTH:
                raise RecipeError(f"the recipe nests more than {MAX_RECIPE_DEPTH} levels deep")
            continue
        if isinstance(event, yaml.AliasEvent):
            if event.anchor not in anchored:
                raise RecipeError(f"the alias *{event.anchor} names no finished anchor (an anchor cannot hold itself)")
            anchor, values = None, anchored[event.anchor]
        elif isinstance(event, yaml.ScalarEvent):
            anchor, values = event.anchor, 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, values = open_collections.pop()
        else:
            continue
        if anchor:
            anchored[anchor] = values
        if open_collections:
            open_collections[-1][1] += values
            values = open_collections[-1][1]
        if values > MAX_RECIPE_VALUES:
            raise RecipeError(f"the recipe's aliases expand to more than {MAX_RECIPE_VALUES:,} values")


def _within_depth(value):
    if nested_deeper_than(value, MAX_RECIPE_DEPTH):
        raise RecipeError(f"the recipe nests more than {MAX_RECIPE_DEPTH} levels deep")
    return value


def load_recipe(path):
    """The recipe file filled in and checked (`validate`); its relative paths are read from its folder."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecipeError(f"cannot read the recipe {path}: {exc}") from exc
    try:
        raw = parse_recipe_text(text, as_json=path.suffix == ".json")
    except RecipeError as exc:
        raise RecipeError(f"{path}: {exc}") from None
    return validate(raw, base_dir=path.parent)


def _resolve(base_dir, value):
    if value is None or "://" in str(value):
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (Path(base_dir) / p))


class _Problems(list):
    """Every problem found, in the order a user reads them, with the checks that add to it."""

    def positive_int(self, where, value, zero_ok=False, maximum=None):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero_ok else 1):
            self.append(f"{where}: must be an integer {'>= 0' if zero_ok else '>= 1'}, got {_shown(value)}")
        elif (maximum := LIMITS.get(where.rsplit(".", 1)[-1], maximum)) is not None and value > maximum:
            self.append(f"{where}: at most {maximum:,}, got {_shown(value)}")

    def positive_number(self, where, value, zero_ok=False):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
                or (value == 0 and not zero_ok):
            self.append(f"{where}: must be a number {'>= 0' if zero_ok else '> 0'}, got {_shown(value)}")
        elif (maximum := LIMITS.get(where.rsplit(".", 1)[-1])) is not None and value > maximum:
            self.append(f"{where}: at most {maximum:g}, got {_shown(value)}")

    def flag(self, where, value):
        if not isinstance(value, bool):
            self.append(f"{where}: true or false")


def validate(raw, base_dir=".", data_on_disk=True):
    """Fill in defaults and check every value; raise RecipeError with all problems at once. With data_on_disk
    false (the dashboard's launch) a phase's data is a name the launch resolves to a stored data set, not a file."""
    if not isinstance(raw, dict):
        raise RecipeError(f"the recipe must be a mapping of settings, got {type(raw).__name__}")
    problems = _Problems()
    recipe = _with_defaults(raw, problems)
    recipe["model"] = _model(raw.get("model"), base_dir, problems)
    _training(recipe, problems)
    _outputs(recipe, base_dir, problems)
    recipe["phases"] = _phases(raw.get("phases"), recipe, base_dir if data_on_disk else None, problems)
    recipe["promote"] = _promote(recipe["promote"], recipe["phases"], problems)
    if problems:
        raise RecipeError("the recipe has {} problem(s):\n  - {}".format(len(problems), "\n  - ".join(problems)))
    return recipe


def _with_defaults(raw: dict, problems: _Problems) -> dict:
    known = set(DEFAULTS) | {"model", "phases"}
    for key in raw:
        if key not in known:
            problems.append(f"unknown setting {key!r} (known: {', '.join(sorted(known))})")
    recipe = {}
    for key, default in DEFAULTS.items():
        value = raw.get(key, default)
        if isinstance(default, dict):
            if not isinstance(value, dict):
                problems.append(f"{key}: must be a mapping")
                value = {}
            unknown = set(value) - set(default)
            if unknown:
                problems.append(f"{key}: unknown setting(s) {', '.join(sorted(unknown))}")
            value = {**default, **value}
        recipe[key] = value
    return recipe


def _model(model, base_dir, problems: _Problems) -> dict:
    if not isinstance(model, dict) or ("path" in model) == ("config" in model):
        problems.append("model: give exactly one of model.path (a folder, a hub id or an s3://bucket/prefix) or "
                        "model.config (a transformers config mapping, random weights)")
        return {}
    model = {**MODEL_DEFAULTS, **model}
    unknown = set(model) - set(MODEL_DEFAULTS) - {"path", "config"}
    if unknown:
        problems.append(f"model: unknown setting(s) {', '.join(sorted(unknown))}")
    if model["dtype"] not in DTYPES:
        problems.append(f"model.dtype: one of {DTYPES}, got {model['dtype']!r}")
    if "config" in model:
        if not isinstance(model["config"], dict) or "model_type" not in model["config"]:
            problems.append("model.config: a mapping with model_type (e.g. qwen3_moe) and the config's fields")
        if model["revision"] is not None:
            problems.append("model.revision: a hub model's branch, tag or commit, for a hub id only")
    else:
        _model_path(model, base_dir, problems)
    if isinstance(model["tokenizer"], str) and model["tokenizer"].startswith("s3://"):
        problems.append("model.tokenizer: a folder or a hub id; an s3:// model's tokenizer is its own files (leave "
                        "tokenizer out)")
    tokenizer = model["tokenizer"]
    if tokenizer is not None and (not isinstance(tokenizer, str) or not tokenizer.strip()):
        problems.append(f"model.tokenizer: a folder or a hub id, got {_shown(tokenizer)}")
    elif tokenizer is not None:
        resolved = _resolve(base_dir, tokenizer)
        if Path(resolved).exists() or model_source.kind_of(tokenizer) != "hub":
            model["tokenizer"] = resolved  # a folder here; a hub id (owner/name) stays one
    return model


def _model_path(model: dict, base_dir, problems: _Problems) -> None:
    """model.path: a folder here, a hub id or an s3://bucket/prefix (training/model_source.py), said when none."""
    path = model["path"]
    if not isinstance(path, str) or not path.strip():
        problems.append("model.path: a folder, a hub id (owner/name) or an s3://bucket/prefix")
        return
    kind = model_source.kind_of(path)
    if kind == "s3":
        if problem := model_source.s3_problem(path):
            problems.append(f"model.path {path}: {problem}")
    elif Path(_resolve(base_dir, path)).exists():
        model["path"] = _resolve(base_dir, path)
        kind = "folder"
    elif kind == "folder":
        problems.append(f"model.path: no folder {path} here, and not a hub id: "
                        f"{model_source.hub_id_problem(path)} (or give an s3://bucket/prefix)")
    if model["revision"] is not None and (kind != "hub" or not isinstance(model["revision"], str)
                                          or not model["revision"].strip()):
        problems.append("model.revision: a hub model's branch, tag or commit, for a hub id only")


def _training(recipe: dict, problems: _Problems) -> None:
    lora = recipe["lora"]
    problems.positive_int("lora.r", lora["r"])
    problems.positive_number("lora.alpha", lora["alpha"])
    problems.flag("lora.attention", lora["attention"])
    problems.extend(target_problems(lora["targets"]))
    for key in ("batch_size", "grad_accum", "seq_len"):
        problems.positive_int(key, recipe[key])
    if isinstance(recipe["seq_len"], int) and 0 < recipe["seq_len"] < MIN_SEQ_LEN:
        # A piece's first token has no label: a piece this short leaves (almost) nothing to train on.
        problems.append(f"seq_len: at least {MIN_SEQ_LEN} tokens, got {recipe['seq_len']}")
    problems.positive_number("lr", recipe["lr"])
    problems.positive_int("warmup_steps", recipe["warmup_steps"], zero_ok=True)
    for key in ("min_lr_ratio", "weight_decay", "max_grad_norm"):
        problems.positive_number(key, recipe[key], zero_ok=True)
    problems.positive_int("seed", recipe["seed"], zero_ok=True)
    problems.positive_int("gpus", recipe["gpus"])
    if isinstance(recipe["gpus"], int) and recipe["gpus"] > MAX_GPUS:
        problems.append(f"gpus: at most {MAX_GPUS} (the GPUs of one box), got {recipe['gpus']}")
    if recipe["schedule"] not in SCHEDULES:
        problems.append(f"schedule: one of {SCHEDULES}, got {recipe['schedule']!r}")
    for key in ("gradient_checkpointing", "cuda_graphs"):
        problems.flag(key, recipe[key])
    if recipe["optimizer"] not in OPTIMIZERS:
        problems.append(f"optimizer: one of {OPTIMIZERS}, got {_shown(recipe['optimizer'])}")
    elif recipe["optimizer"] != "adamw" and recipe["gpus"] != 1:
        problems.append(f"optimizer: {recipe['optimizer']} runs on one GPU (gpus: 1); several GPUs step with adamw")
    if recipe["memory_plan"] not in MEMORY_PLANS:
        problems.append(f"memory_plan: one of {MEMORY_PLANS}, got {_shown(recipe['memory_plan'])}")


def _outputs(recipe: dict, base_dir, problems: _Problems) -> None:
    ckpt = recipe["checkpoint"]
    if not ckpt["store"]:
        problems.append("checkpoint.store: a folder or an s3://bucket/prefix URL")
    else:
        ckpt["store"] = _resolve(base_dir, ckpt["store"])
    ckpt["staging"] = _resolve(base_dir, ckpt["staging"] or "checkpoint-staging")
    problems.positive_int("checkpoint.keep", ckpt["keep"])
    problems.positive_int("checkpoint.every", ckpt["every"])
    metrics = recipe["metrics"]
    metrics["jsonl"] = _resolve(base_dir, metrics["jsonl"]) if metrics["jsonl"] else None
    if not metrics["jsonl"]:
        problems.append("metrics.jsonl: a file path (the JSONL sink is always on)")
    problems.positive_int("metrics.router_every", metrics["router_every"], zero_ok=True)


def _phases(phases, recipe: dict, base_dir, problems: _Problems) -> list[dict]:
    """The phases checked; base_dir None leaves their data names as they are, unresolved and unchecked."""
    if not isinstance(phases, list) or not phases:
        problems.append("phases: a non-empty list of phases")
        return []
    names: set[str] = set()
    checked = (_phase(i, phase, recipe, base_dir, names, problems) for i, phase in enumerate(phases))
    checked_phases = [phase for phase in checked if phase is not None]
    kinds = [phase.get("kind") if isinstance(phase, dict) else None for phase in phases]
    evals = [i for i, kind in enumerate(kinds) if kind == EVAL_KIND]
    if len(evals) > 1:
        problems.append(f"phases: at most one eval phase, got {len(evals)} (phases {', '.join(map(str, evals))})")
    elif evals and (evals[0] == 0 or evals[0] != len(phases) - 1):
        problems.append(f"phases[{evals[0]}]: an eval phase comes after every training phase, with at least one "
                        "before it (it evaluates the last one's adapter)")
    return checked_phases


def _promote(promote, phases: list[dict], problems: _Problems) -> dict | None:
    """The recipe's `promote:` rule with its defaults, or None; only a recipe with an eval phase takes one."""
    if promote is None:
        return None
    if not isinstance(promote, dict):
        problems.append(f"promote: a mapping such as {{metric: difference, min_gain: 0.05}}, got {_shown(promote)}")
        return None
    if not any(phase["kind"] == EVAL_KIND for phase in phases):
        problems.append("promote: needs an eval phase (kind: eval) after the training phases to judge by")
    unknown = set(promote) - set(PROMOTE_DEFAULTS)
    if unknown:
        problems.append(f"promote: unknown setting(s) {', '.join(sorted(map(str, unknown)))} "
                        f"(known: {', '.join(PROMOTE_DEFAULTS)})")
    promote = {**PROMOTE_DEFAULTS, **promote}
    if promote["metric"] not in PROMOTE_METRICS:
        problems.append(f"promote.metric: one of {PROMOTE_METRICS}, got {_shown(promote['metric'])}")
    for key, low in (("min_gain", -1.0), ("min_score", 0.0)):
        value = promote[key]
        if value is None and key == "min_score":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= 1:
            problems.append(f"promote.{key}: a number from {low:g} to 1 (scores are in [0, 1]), got {_shown(value)}")
    return promote


def _phase(i: int, phase, recipe: dict, base_dir, names: set[str], problems: _Problems) -> dict | None:
    where = f"phases[{i}]"
    if not isinstance(phase, dict):
        problems.append(f"{where}: must be a mapping")
        return None
    kind = phase.get("kind")
    if kind not in PHASE_KINDS:
        problems.append(f"{where}.kind: one of {PHASE_KINDS}, got {kind!r}")
        return None
    own = PHASE_DEFAULTS.get(kind, {})
    if kind == EVAL_KIND:
        training_only = sorted(set(phase) & {"steps", "lr", "checkpoint_every", "min_step_seconds", "reward"})
        if training_only:
            problems.append(f"phases[{i}]: {', '.join(training_only)}: not for an eval phase (it trains nothing and "
                            "answers each record once; max_samples cuts the file)")
        phase = {key: value for key, value in phase.items() if key not in training_only}
        phase["steps"] = 0
    phase = {"name": kind, "checkpoint_every": recipe["checkpoint"]["every"], "lr": recipe["lr"], **own,
             "reward": None, "min_step_seconds": 0.0, **phase}
    where = f"phases[{i}] ({phase['name']})"
    unknown = set(phase) - PHASE_COMMON - set(own)
    if unknown:
        problems.append(f"{where}: unknown setting(s) {', '.join(sorted(unknown))} for a {kind} phase")
    if not isinstance(phase["name"], str) or not PHASE_NAME.fullmatch(phase["name"]):
        problems.append(f"phases[{i}].name: 1-40 letters, digits, '.', '_' or '-', got {_shown(phase['name'])}")
        return None
    if phase["name"] in names:
        problems.append(f"{where}.name: {phase['name']!r} is used twice; phases need distinct names")
    names.add(phase["name"])
    if not phase.get("data") or not isinstance(phase["data"], str):
        problems.append(f"{where}.data: a JSONL file")
    elif base_dir is not None:
        phase["data"] = _resolve(base_dir, phase["data"])
        if not Path(phase["data"]).is_file():
            problems.append(f"{where}.data: no such file {phase['data']}")
    if kind == EVAL_KIND:
        _eval_settings(where, phase, problems)
        return phase
    problems.positive_int(f"{where}.steps", phase.get("steps"))
    problems.positive_int(f"{where}.checkpoint_every", phase["checkpoint_every"])
    problems.positive_number(f"{where}.lr", phase["lr"])
    problems.positive_number(f"{where}.min_step_seconds", phase["min_step_seconds"], zero_ok=True)
    if kind in ("dpo", "kto"):
        problems.positive_number(f"{where}.beta", phase["beta"])
    if kind == "kto":
        for key in ("desirable_weight", "undesirable_weight"):
            problems.positive_number(f"{where}.{key}", phase[key])
    if kind == "grpo":
        if recipe["gpus"] != 1:
            problems.append(f"{where}: a grpo phase runs on one GPU (gpus: 1): its ranks would generate "
                            "completions of different lengths, out of step with each other")
        if problem := reward_problem(phase["reward"]):
            problems.append(f"{where}.reward: {problem}")
        problems.positive_int(f"{where}.num_generations", phase["num_generations"])
        if isinstance(phase["num_generations"], int) and phase["num_generations"] < 2:
            problems.append(f"{where}.num_generations: at least 2 (advantages are relative within a group)")
        problems.positive_int(f"{where}.max_new_tokens", phase["max_new_tokens"])
        problems.positive_number(f"{where}.temperature", phase["temperature"])
    elif phase["reward"] is not None:
        problems.append(f"{where}.reward: only a grpo phase takes a reward function")
    _held_out(where, phase, base_dir, problems)
    return phase


def _held_out(where: str, phase: dict, base_dir, problems: _Problems) -> None:
    """eval_data (a file, resolved as data is) or eval_split (a share of the data), and eval_every."""
    data, split, every = phase["eval_data"], phase["eval_split"], phase["eval_every"]
    if data is not None and split:
        problems.append(f"{where}: give eval_data (a held-out file) or eval_split (a share of data), not both")
    if data is not None:
        if not isinstance(data, str) or not data.strip():
            problems.append(f"{where}.eval_data: a JSONL file of {phase['kind']} records, got {_shown(data)}")
        elif base_dir is not None:
            phase["eval_data"] = _resolve(base_dir, data)
            if not Path(phase["eval_data"]).is_file():
                problems.append(f"{where}.eval_data: no such file {phase['eval_data']}")
    if isinstance(split, bool) or not isinstance(split, (int, float)) or not math.isfinite(split) \
            or not 0 <= split <= MAX_EVAL_SPLIT:
        problems.append(f"{where}.eval_split: a share of the phase's records above 0 and at most {MAX_EVAL_SPLIT:g} "
                        f"(0.05 holds out one in twenty), got {_shown(split)}")
    problems.positive_int(f"{where}.eval_every", every, zero_ok=True)
    if isinstance(every, int) and every > 0 and data is None and not split:
        problems.append(f"{where}.eval_every: validates held-out data; give eval_data or eval_split too")


def _eval_settings(where: str, phase: dict, problems: _Problems) -> None:
    scorer = phase["scorer"]
    if scorer not in SCORERS and (not isinstance(scorer, str) or ":" not in scorer):
        problems.append(f"{where}.scorer: one of {', '.join(SCORERS)} or a function as 'module:function', got "
                        f"{_shown(scorer)}")
    elif scorer not in SCORERS and (problem := reward_problem(scorer, "a scoring function")):
        problems.append(f"{where}.scorer: {problem}")
    problems.positive_int(f"{where}.max_new_tokens", phase["max_new_tokens"])
    problems.positive_int(f"{where}.max_samples", phase["max_samples"], zero_ok=True)
    problems.positive_int(f"{where}.time_limit_s", phase["time_limit_s"])
    problems.positive_int(f"{where}.batch_size", phase["batch_size"])
