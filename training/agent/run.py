"""A box's run from a proven install to a running trainer: the probe, the spec, the checkpoint to resume from, the
data and the model, then the trainer as a child process, watched until it ends."""

import functools
import json
import subprocess
from pathlib import Path

from training import model_source
from training.checkpoint_names import checkpoint_name

from .dashboard import Api
from .evaluation import eval_phase, evaluate
from .exit_codes import Exit
from .heartbeat import Heartbeat
from .inputs import DataRefused, fetch_data, fetch_model
from .install_probe import probe
from .metrics import MetricsForwarder
from .resume import RestoreFailed, restore
from .retry import retried
from .uploads import Uploader, complete_checkpoints
from .watch import watch

SPEC_TRIES, SPEC_FIRST_WAIT_S, SPEC_MAX_WAIT_S = 10, 15.0, 120.0  # about fifteen minutes of waits in all


def run(api: Api, heartbeat: Heartbeat, workdir: Path, python: str) -> Exit:
    ok, output = probe(python)
    if not ok:
        api.call("POST", "events", {"kind": "probe_failed", "message": f"No probe sentinel. {output}"[-4000:]})
        return Exit.PROBE_FAILED
    api.call("POST", "events", {"kind": "probe_ok", "message": output.strip().splitlines()[-1][:500]})

    # A spec the dashboard cannot answer yet (its store's bad minutes: 503) is asked for again for a quarter of an
    # hour, the heartbeat going on meanwhile, before the box gives up and the supervisor replaces it.
    spec = retried(lambda: api.call("GET", "spec"), tries=SPEC_TRIES, first_s=SPEC_FIRST_WAIT_S,
                   cap_s=SPEC_MAX_WAIT_S, retry_on=(ConnectionError,))
    heartbeat.interval_s, heartbeat.window_s = spec["heartbeat_interval_s"], spec["dead_man_window_s"]
    store, staging, metrics_path = workdir / "store", workdir / "staging", workdir / "metrics.jsonl"
    recipe = {**spec["recipe"], "metrics": {"jsonl": str(metrics_path)},
              "checkpoint": {**spec["recipe"].get("checkpoint", {}), "store": str(store), "staging": str(staging),
                             "endpoint_url": None, "region": None}}
    store.mkdir(parents=True, exist_ok=True)
    try:
        restore(api, spec.get("resume") or [], store)
    except RestoreFailed as exc:
        # The box exits without training: its heartbeat stops, the dashboard takes it for lost and rents another,
        # which is offered the same checkpoint.
        message = f"{exc} It is kept for the box that replaces this one; this box stops."
        api.call("POST", "events", {"kind": "log", "message": message[:4000]})
        return Exit.CHECKPOINT_UNREACHABLE
    try:
        recipe["phases"] = fetch_data(spec["phases"], recipe.get("phases") or [], workdir / "data")
    except DataRefused as exc:
        api.call("POST", "events", {"kind": "trainer_failed", "message": f"Nothing was trained: {exc}"[:4000]})
        return Exit.DATA_REFUSED
    try:
        recipe["model"] = fetch_model(api, spec.get("model"), recipe.get("model") or {}, workdir / "model",
                                      volume=spec.get("model_volume"))
    except model_source.ModelRefused as exc:
        api.call("POST", "events", {"kind": "trainer_failed", "message": f"Nothing was trained: {exc}"[:4000]})
        return Exit.MODEL_REFUSED
    recipe_path = workdir / "recipe.json"
    recipe_path.write_text(json.dumps(recipe))
    evaluation = spec.get("evaluation")
    if isinstance(evaluation, dict) and eval_phase(recipe) is not None:
        # Every training phase is banked: this box only evaluates, skipping the samples already recorded.
        api.call("POST", "events", {"kind": "log", "message": "Every training phase is banked: this box evaluates."})
        return evaluate(api, heartbeat, recipe_path, workdir, python, done=evaluation.get("done") or ())
    on_trained = None
    if eval_phase(recipe) is not None:
        on_trained = functools.partial(evaluate, api, heartbeat, recipe_path, workdir, python)

    metrics = MetricsForwarder(api, metrics_path, spec["max_metric_points"])
    finals = frozenset(checkpoint_name(p["index"], p["steps"]) for p in spec["phases"])
    uploader = Uploader(api, spec["upload"], workdir / "outbox", before_complete=metrics.flush, protected=finals)
    uploader.offered.update(p.name for p in complete_checkpoints(store))  # already in the bucket
    heartbeat.on_upload_grant = uploader.renew
    uploader.start()
    with open(workdir / "trainer.log", "ab") as trainer_log:
        # The trainer stays in the agent's process group: whatever takes the agent down (a dead host, a kill of
        # the group) takes the trainer with it, and a frozen host freezes both.
        from training.distributed import command  # torch: only once the install is proven

        trainer = subprocess.Popen(command(recipe_path, int(recipe.get("gpus") or 1), python),
                                   stdout=trainer_log, stderr=subprocess.STDOUT)
        return watch(api, trainer, uploader, metrics, heartbeat, store, workdir, on_trained=on_trained)
