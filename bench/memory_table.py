"""The memory plans' table in one go: for each model and card budget, the plan the trainer takes there
(training/memory_plan.py), its predicted reserve and speed beside what `bench/train_step.py --memory-plan auto`
measures in that budget. Each run is a process of its own with its own time limit, and each result is appended to
--out as it comes, so a run that hangs or runs out of time loses only itself. Predicted tokens/s: the whole card's
measured figure (the budget "whole", measured in this run or an earlier one that wrote to the same --out) times
the plan's speed. Last line: one JSON object.

    python bench/memory_table.py [--models qwen3-30b-a3b,qwen3.6-35b-a3b] [--budgets whole,96,80,76]
        [--steps 3] [--limit-s 540] [--out table.jsonl] [--optimizer adamw] [--packed 600]
    python bench/memory_table.py --smoke   each model's family in miniature on the CPU, budgets of 2 and 1 GiB
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def command(model, budget, args):
    line = [sys.executable, "-u", str(HERE / "train_step.py"), "--model", model, "--backends",
            "ours:eager" if args.smoke else "ours", "--memory-plan", "auto", "--optimizer", args.optimizer]
    line += ["--smoke"] if args.smoke else ["--steps", str(args.steps)]
    line += ["--packed", str(args.packed)] if args.packed else []
    return line + ([] if budget == "whole" else ["--memory-budget-gib", budget])


def measured(model, budget, args):
    """The budget's row: the plan and figures train_step printed, or why there are none (out of memory, the time
    limit, a crash: the last words it printed)."""
    row = {"model": model, "budget_gib": budget}
    started = time.monotonic()
    try:
        done = subprocess.run(command(model, budget, args), capture_output=True, text=True, timeout=args.limit_s)
        out, code, said = done.stdout, done.returncode, done.stderr
    except subprocess.TimeoutExpired as exc:  # what it printed so far comes as bytes, whatever text= said
        out, code = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or "", None
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        row["error"] = f"no result within {args.limit_s:.0f} s"
    row["wall_s"] = round(time.monotonic() - started, 1)
    results = [json.loads(line) for line in out.splitlines() if line.startswith('{"backend"')]
    if results and not results[-1].get("oom"):
        r = results[-1]
        plan = r.get("memory_plan") or {}
        row.update(plan=plan.get("plan"), predicted_gib=plan.get("total_gib"), speed=plan.get("speed"),
                   tokens_per_second=r["tokens_per_second"], peak_reserved_gib=r.get("peak_reserved_gib"),
                   warmup_peak_reserved_gib=r.get("warmup_peak_reserved_gib"), deltanet_path=r.get("deltanet_path"),
                   cuda_graphs_replayed=r.get("cuda_graphs_replayed"), loss=r.get("loss"))
    elif results:
        row["error"] = f"out of memory at {results[-1].get('peak_reserved_gib')} GiB reserved: " \
            + (results[-1].get("error") or "")[:120]
    elif "error" not in row:  # a crash: its own last words (a traceback's last line), else the last it printed
        last = (said.strip().splitlines() or out.strip().splitlines() or [""])[-1]
        row["error"] = f"exit {code}: " + last[-300:]
    return row


def earlier_rows(path):
    """The rows an earlier run appended to `path` (--out): a lease's calls often measure one budget each, and the
    whole card's figure, which every other budget's prediction needs, may have come in an earlier call. Lines that are
    not such rows are passed over."""
    rows = []
    for line in path.read_text().splitlines() if path and path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and {"model", "budget_gib"} <= row.keys():
            rows.append(row)
    return rows


def with_predictions(rows, earlier=()):
    """Each row's predicted tokens/s: its model's whole-card measured figure (this run's, else the latest of
    `earlier`) times the plan's speed."""
    whole = {r["model"]: r["tokens_per_second"] for r in [*earlier, *rows]
             if r["budget_gib"] == "whole" and r.get("tokens_per_second")}
    for r in rows:
        if whole.get(r["model"]) and r.get("speed") is not None:
            r["predicted_tokens_per_second"] = round(whole[r["model"]] * r["speed"])
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="qwen3-30b-a3b,qwen3.6-35b-a3b")
    parser.add_argument("--budgets", default="whole,96,80,76", help="GiB each, or whole: the card as it is")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizer", default="adamw", help="the recipe's floor (the plan may be more frugal)")
    parser.add_argument("--limit-s", type=float, default=540.0, help="each run's time limit")
    parser.add_argument("--packed", type=int, metavar="MEAN",
                        help="rows packed from documents of MEAN tokens on average, as CPT and SFT train")
    parser.add_argument("--out", type=Path, help="append each row here as JSON as it comes")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.budgets, args.limit_s = "2,1", 300.0
    earlier, rows = earlier_rows(args.out), []
    for model in args.models.split(","):
        for budget in args.budgets.split(","):
            row = measured(model, budget, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    with_predictions(rows, earlier)
    print("| model | budget GiB | plan | predicted GiB | first step's peak GiB | peak reserved GiB "
          "| predicted tokens/s | tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r.get("plan") or r.get("error"), r.get("predicted_gib"), r.get("warmup_peak_reserved_gib"),
                 r.get("peak_reserved_gib"), r.get("predicted_tokens_per_second"), r.get("tokens_per_second")]
        print(f"| {r['model']} | {r['budget_gib']} | " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    print(json.dumps({"rows": rows, "measured": sum("tokens_per_second" in r for r in rows)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
