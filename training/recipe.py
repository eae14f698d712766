"""The recipe: one YAML (or JSON) file of plain values that says everything a run does.

    model:            {path: Qwen/Qwen3-30B-A3B}  or  {config: {model_type: qwen3_moe, ...}, seed: 0}
                      dtype: bfloat16 (default) | float32; tokenizer: a path (default: the model path; a byte
                      tokenizer for a config with random weights)
    lora:             {r: 32, alpha: 64, attention: true}   (routed experts always; router frozen)
    batch_size: 2     grad_accum: 8     seq_len: 2048
    lr: 2.0e-4        schedule: cosine | linear | constant     warmup_steps: 0     min_lr_ratio: 0.1
    weight_decay: 0.0 max_grad_norm: 1.0    gradient_checkpointing: false    seed: 0
    cuda_graphs: true (on a GPU, CPT/SFT micro-steps of one shape are captured once and replayed)
    checkpoint:       {store: ./checkpoints | s3://bucket/prefix, endpoint_url:, region:, keep: 3, every: 50,
                       staging: ./checkpoint-staging (local snapshots waiting for upload)}
    metrics:          {jsonl: ./metrics.jsonl}   (the on-box agent tails it and posts each step to the dashboard)
    phases:           a list; each {name, kind: cpt|sft|dpo|kto|grpo, data: file.jsonl, steps,
                      checkpoint_every (default checkpoint.every), lr (default the run's), beta (dpo, kto),
                      reward: module:function, num_generations, max_new_tokens, temperature (grpo)}

Relative paths are read from the recipe's folder. `load_recipe` returns a dict with every default filled in, or
raises RecipeError listing every problem at once.
"""

import json
from pathlib import Path

import yaml

PHASE_KINDS = ("cpt", "sft", "dpo", "kto", "grpo")
SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("bfloat16", "float32", "float16")

DEFAULTS = {
    "lora": {"r": 32, "alpha": 64, "attention": True},
    "batch_size": 2,
    "grad_accum": 8,
    "seq_len": 2048,
    "lr": 2.0e-4,
    "schedule": "cosine",
    "warmup_steps": 0,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "gradient_checkpointing": False,
    "cuda_graphs": True,
    "seed": 0,
    "checkpoint": {"store": "checkpoints", "endpoint_url": None, "region": None, "keep": 3, "every": 50,
                   "staging": "checkpoint-staging"},
    "metrics": {"jsonl": "metrics.jsonl"},
}
PHASE_DEFAULTS = {
    "dpo": {"beta": 0.1},
    "kto": {"beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.0},
    "grpo": {"num_generations": 4, "max_new_tokens": 64, "temperature": 1.0},
}


class RecipeError(ValueError):
    """The recipe is not usable; the message lists every problem found."""


def load_recipe(path):
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecipeError(f"cannot read the recipe {path}: {exc}") from exc
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise RecipeError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    return validate(raw, base_dir=path.parent)


def _resolve(base_dir, value):
    if value is None or "://" in str(value):
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (Path(base_dir) / p))


def validate(raw, base_dir="."):
    """Fill in defaults and check every value; raise RecipeError with all problems at once."""
    problems = []
    if not isinstance(raw, dict):
        raise RecipeError(f"the recipe must be a mapping of settings, got {type(raw).__name__}")
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

    def positive_int(where, value, zero_ok=False):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero_ok else 1):
            problems.append(f"{where}: must be an integer {'>= 0' if zero_ok else '>= 1'}, got {value!r}")

    def positive_number(where, value, zero_ok=False):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero_ok):
            problems.append(f"{where}: must be a number {'>= 0' if zero_ok else '> 0'}, got {value!r}")

    model = raw.get("model")
    if not isinstance(model, dict) or ("path" in model) == ("config" in model):
        problems.append("model: give exactly one of model.path (a local folder or hub id) or model.config "
                        "(a transformers config mapping, random weights)")
        model = {}
    else:
        model = {"dtype": "bfloat16", "seed": 0, "tokenizer": None, **model}
        unknown = set(model) - {"path", "config", "dtype", "seed", "tokenizer"}
        if unknown:
            problems.append(f"model: unknown setting(s) {', '.join(sorted(unknown))}")
        if model["dtype"] not in DTYPES:
            problems.append(f"model.dtype: one of {DTYPES}, got {model['dtype']!r}")
        if "config" in model:
            if not isinstance(model["config"], dict) or "model_type" not in model["config"]:
                problems.append("model.config: a mapping with model_type (e.g. qwen3_moe) and the config's fields")
        elif Path(_resolve(base_dir, model["path"])).exists():
            model["path"] = _resolve(base_dir, model["path"])
        model["tokenizer"] = _resolve(base_dir, model["tokenizer"])
    recipe["model"] = model

    lora = recipe["lora"]
    positive_int("lora.r", lora["r"])
    positive_number("lora.alpha", lora["alpha"])
    if not isinstance(lora["attention"], bool):
        problems.append("lora.attention: true or false")
    for key in ("batch_size", "grad_accum", "seq_len"):
        positive_int(key, recipe[key])
    positive_number("lr", recipe["lr"])
    positive_int("warmup_steps", recipe["warmup_steps"], zero_ok=True)
    positive_number("min_lr_ratio", recipe["min_lr_ratio"], zero_ok=True)
    positive_number("weight_decay", recipe["weight_decay"], zero_ok=True)
    positive_number("max_grad_norm", recipe["max_grad_norm"], zero_ok=True)
    positive_int("seed", recipe["seed"], zero_ok=True)
    if recipe["schedule"] not in SCHEDULES:
        problems.append(f"schedule: one of {SCHEDULES}, got {recipe['schedule']!r}")
    for flag in ("gradient_checkpointing", "cuda_graphs"):
        if not isinstance(recipe[flag], bool):
            problems.append(f"{flag}: true or false")

    ckpt = recipe["checkpoint"]
    if not ckpt["store"]:
        problems.append("checkpoint.store: a folder or an s3://bucket/prefix URL")
    else:
        ckpt["store"] = _resolve(base_dir, ckpt["store"])
    ckpt["staging"] = _resolve(base_dir, ckpt["staging"] or "checkpoint-staging")
    positive_int("checkpoint.keep", ckpt["keep"])
    positive_int("checkpoint.every", ckpt["every"])
    metrics = recipe["metrics"]
    metrics["jsonl"] = _resolve(base_dir, metrics["jsonl"]) if metrics["jsonl"] else None
    if not metrics["jsonl"]:
        problems.append("metrics.jsonl: a file path (the JSONL sink is always on)")

    phases = raw.get("phases")
    recipe["phases"] = []
    if not isinstance(phases, list) or not phases:
        problems.append("phases: a non-empty list of phases")
        phases = []
    names = set()
    for i, phase in enumerate(phases):
        where = f"phases[{i}]"
        if not isinstance(phase, dict):
            problems.append(f"{where}: must be a mapping")
            continue
        kind = phase.get("kind")
        if kind not in PHASE_KINDS:
            problems.append(f"{where}.kind: one of {PHASE_KINDS}, got {kind!r}")
            continue
        phase = {"name": kind, "checkpoint_every": ckpt["every"], "lr": recipe["lr"],
                 **PHASE_DEFAULTS.get(kind, {}), "reward": None, **phase}
        where = f"phases[{i}] ({phase['name']})"
        allowed = {"name", "kind", "data", "steps", "checkpoint_every", "lr", "reward"} | set(PHASE_DEFAULTS.get(kind, {}))
        unknown = set(phase) - allowed
        if unknown:
            problems.append(f"{where}: unknown setting(s) {', '.join(sorted(unknown))} for a {kind} phase")
        if phase["name"] in names:
            problems.append(f"{where}.name: {phase['name']!r} is used twice; phases need distinct names")
        names.add(phase["name"])
        if not phase.get("data"):
            problems.append(f"{where}.data: a JSONL file")
        else:
            phase["data"] = _resolve(base_dir, phase["data"])
            if not Path(phase["data"]).is_file():
                problems.append(f"{where}.data: no such file {phase['data']}")
        positive_int(f"{where}.steps", phase.get("steps"))
        positive_int(f"{where}.checkpoint_every", phase["checkpoint_every"])
        positive_number(f"{where}.lr", phase["lr"])
        if kind in ("dpo", "kto"):
            positive_number(f"{where}.beta", phase["beta"])
        if kind == "grpo":
            if not isinstance(phase["reward"], str) or ":" not in phase["reward"]:
                problems.append(f"{where}.reward: a reward function as 'module:function', got {phase['reward']!r}")
            positive_int(f"{where}.num_generations", phase["num_generations"])
            if isinstance(phase["num_generations"], int) and phase["num_generations"] < 2:
                problems.append(f"{where}.num_generations: at least 2 (advantages are relative within a group)")
            positive_int(f"{where}.max_new_tokens", phase["max_new_tokens"])
            positive_number(f"{where}.temperature", phase["temperature"])
        elif phase["reward"] is not None:
            problems.append(f"{where}.reward: only a grpo phase takes a reward function")
        recipe["phases"].append(phase)

    if problems:
        raise RecipeError("the recipe has {} problem(s):\n  - {}".format(len(problems), "\n  - ".join(problems)))
    return recipe
