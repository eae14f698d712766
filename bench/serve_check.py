"""Does vLLM serve our exported adapters as peft computes them? A tiny random Qwen3-MoE and Qwen3.5-MoE (with a
tokenizer), trained a few steps by the trainer, exported in every layout (vllm, peft, merged); vLLM's greedy answers
and log-probabilities against transformers + peft on the same prompts, the OpenAI server started with the serving
box's own command line, and generation tokens/s with and without the adapter (JSON last line).

    python bench/serve_check.py prepare OUT     build, train, export (a CPU will do)
    python bench/serve_check.py check OUT       on a GPU with vLLM: compare, serve, time
    python bench/serve_check.py OUT             both
    python bench/serve_check.py --smoke         tiny sizes on a CPU: peft against merged only; vLLM skipped

`check --dtype float32` runs vLLM and the reference in float32, where kernel differences are too small to flip a
greedy choice: there a layout error shows as unequal answers. `--family` checks one family only.
"""
import argparse
import functools
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# nats: bf16 logits through different kernels (vLLM's fused MoE and LoRA, transformers'), on the tiny models' sharp
# output head (logits spread about 8): 0.32 seen for merged weights, 0.47 with vLLM's LoRA (H200, vLLM 0.26.0).
LOGPROB_TOLERANCE = 0.5
TIE_MARGIN = 0.05  # a position whose top two log-probs are closer than this may go either way in bf16
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
VOCAB = 512
SIZES = {"prompts": 32, "prompt_len": 64, "new_tokens": 64, "hidden": 128, "experts": 8, "layers": 4, "r": 8,
         "steps": 6}
SMOKE_SIZES = {"prompts": 4, "prompt_len": 16, "new_tokens": 8, "hidden": 64, "experts": 4, "layers": 4, "r": 4,
               "steps": 2}
FAMILIES = ("qwen3_moe", "qwen3_5_moe")
LAYOUTS = ("vllm", "peft", "merged")


# -- the tiny models --------------------------------------------------------------------------------------------


def tokenizer():
    """A byte-level tokenizer: 256 byte tokens, Qwen's special tokens, fillers up to VOCAB ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    fillers = [f"<|extra_{i}|>" for i in range(VOCAB - 256 - len(SPECIALS))]
    fast = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIALS[1:] + fillers)
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return fast


def text_fields(family, s):
    head = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
    common = {"vocab_size": VOCAB, "hidden_size": s["hidden"], "num_hidden_layers": s["layers"],
              "num_experts": s["experts"], "num_experts_per_tok": 2, "moe_intermediate_size": s["hidden"] // 2,
              "max_position_embeddings": 1024, "tie_word_embeddings": False, **head}
    if family == "qwen3_moe":
        return {**common, "intermediate_size": s["hidden"] * 2, "norm_topk_prob": True}
    return {**common, "shared_expert_intermediate_size": s["hidden"] // 2, "linear_num_value_heads": 4,
            "linear_num_key_heads": 2, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
            # as the published configs have it: interleaved M-RoPE over a quarter of each head, its three sections
            # summing to the rotary frequencies (64 x 0.25 / 2 = 8; Qwen3.5's own: 256 x 0.25 / 2 = 11 + 11 + 10)
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [3, 3, 2], "mrope_interleaved": True}}


def build(folder, family, s, seed=0):
    """A random bf16 model of `family` saved to `folder` with its tokenizer (and, for Qwen3.5-MoE, the image and
    video processors its multimodal class needs). The output head is scaled up so that the greedy choice is clear."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = tokenizer()
    ids = {name: tok.convert_tokens_to_ids(name) for name in SPECIALS}
    fields = text_fields(family, s)
    fields["eos_token_id"], fields["pad_token_id"] = ids["<|im_end|>"], ids["<|endoftext|>"]
    torch.manual_seed(seed)
    if family == "qwen3_moe":
        config = AutoConfig.for_model("qwen3_moe", **fields)
        model = AutoModelForCausalLM.from_config(config)
    else:
        from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

        config = Qwen3_5MoeConfig(
            text_config=fields, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=False,
            vision_config={"depth": 1, "hidden_size": 64, "num_heads": 1, "intermediate_size": 128,
                           "out_hidden_size": s["hidden"], "patch_size": 16, "spatial_merge_size": 2,
                           "temporal_patch_size": 2})
        model = Qwen3_5MoeForConditionalGeneration(config)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.normal_(0.0, 8.0 / s["hidden"] ** 0.5)  # logits of about unit-8 spread: a clear greedy choice
    model.to(torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    if family == "qwen3_5_moe":
        try:
            from transformers import AutoProcessor, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

            processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tok,
                                         video_processor=Qwen3VLVideoProcessor(), chat_template=tok.chat_template)
        except ImportError as exc:  # Pillow and torchvision: only vLLM needs the processors
            print(f"note: {family} saved without its image processor ({str(exc).strip()[:120]})")
        else:
            processor.save_pretrained(folder)
            AutoProcessor.from_pretrained(folder)  # loads back, as vLLM will load it
    return Path(folder)


def train(work, model_dir, s, family):
    """The trainer's own run (a cpt phase) on the example data; returns the final checkpoint folder."""
    import yaml

    recipe = {"model": {"path": str(model_dir), "dtype": "float32"}, "lora": {"r": s["r"], "alpha": 2 * s["r"]},
              "batch_size": 2, "grad_accum": 1, "seq_len": 64, "lr": 5e-3,
              "checkpoint": {"store": str(work / "store"), "staging": str(work / "staging"), "every": s["steps"],
                             "keep": 1},
              "metrics": {"jsonl": str(work / "metrics.jsonl")},
              "phases": [{"kind": "cpt", "data": str(ROOT / "training/examples/cpt.jsonl"), "steps": s["steps"]}]}
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the tiny runs train on the CPU (no FLA needed there)
    done = subprocess.run([sys.executable, "-m", "training.train", "--recipe", str(work / "recipe.yaml")], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{family}: training failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return sorted((work / "store").iterdir())[-1]


def zero_factors(checkpoint):
    """The adapter's LoRA tensors that are all zeros (none, once trained: B starts at zero)."""
    from safetensors.torch import load_file

    state = load_file(checkpoint / "adapter" / "adapter_model.safetensors")
    return sorted(k for k, t in state.items() if not t.any()), len(state)


def export(checkpoint, model_dir, out, fmt):
    """`python -m training.export_adapter --format fmt ...`, in this process."""
    from training.export_adapter import main as export_main

    if export_main(["--format", fmt, "--adapter", str(checkpoint), "--base", str(model_dir), "--out", str(out)]):
        raise RuntimeError(f"export {fmt} of {checkpoint} failed")
    return out


def serve_line():
    """The serving box's vLLM command line as the product writes it, its base and port left as $BASE and $PORT."""
    from fleet.inference.vllm_command import TENSOR_PARALLEL, serve_command

    return {"tensor_parallel": list(TENSOR_PARALLEL),
            "command": serve_command("$BASE", "", "$PORT", "tiny-adapter"),
            "name": "tiny-adapter"}


def prepare(out, s):
    """Models, adapters, exports and prompts under `out`; returns what was made (the plan `check` reads)."""
    import random

    out.mkdir(parents=True, exist_ok=True)
    plan = {"sizes": s, "families": {}, "out": str(out)}
    for family in FAMILIES:
        work = out / family
        work.mkdir(exist_ok=True)
        model_dir = build(work / "base", family, s)
        t = time.time()
        checkpoint = train(work, model_dir, s, family)
        zeros, count = zero_factors(checkpoint)
        entry = {"base": str(model_dir), "checkpoint": str(checkpoint), "train_s": round(time.time() - t, 1),
                 "zero_factors": zeros, "factors": count, "r": s["r"], "exports": {}}
        for fmt in LAYOUTS:
            entry["exports"][fmt] = str(export(checkpoint, model_dir, work / f"export-{fmt}", fmt))
        plan["families"][family] = entry
    rng = random.Random(0)
    plan["prompts"] = [[rng.randrange(256) for _ in range(s["prompt_len"])] for _ in range(s["prompts"])]
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    return plan


# -- transformers + peft, the reference --------------------------------------------------------------------------


def hf_model(base, adapter=None, device="cpu", dtype="bfloat16"):
    import torch
    from transformers import AutoConfig

    from training.export_adapter import model_class

    config = AutoConfig.from_pretrained(base)
    model = model_class(config.architectures[0]).from_pretrained(base, dtype=getattr(torch, dtype)).to(device)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).to(device)
    return model.eval()


def hf_logprobs(model, sequences):
    """log-softmax (float32) of the model's logits over each whole sequence: (N, T, V)."""
    import torch

    with torch.no_grad():
        ids = torch.tensor(sequences, device=model.device)
        return torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)


def hf_greedy(model, prompts, new_tokens):
    """Greedy tokens and their log-probs, each step a whole forward pass (no cache)."""
    seqs = [list(p) for p in prompts]
    tokens = [[] for _ in prompts]
    logps = [[] for _ in prompts]
    for _ in range(new_tokens):
        last = hf_logprobs(model, seqs)[:, -1]
        best = last.argmax(-1).tolist()
        for i, t in enumerate(best):
            seqs[i].append(t)
            tokens[i].append(t)
            logps[i].append(float(last[i, t]))
    return tokens, logps


def teacher_forced(model, prompts, tokens):
    """Per position of each answer: the model's log-prob of the given token, its argmax and its top-2 margin."""
    lp = hf_logprobs(model, [p + t for p, t in zip(prompts, tokens, strict=True)])
    n = len(prompts[0])
    rows = []
    for i, answer in enumerate(tokens):
        at = lp[i, n - 1:n - 1 + len(answer)]
        top = at.topk(2, dim=-1)
        rows.append({"logp": [float(at[j, t]) for j, t in enumerate(answer)], "argmax": top.indices[:, 0].tolist(),
                     "margin": (top.values[:, 0] - top.values[:, 1]).tolist()})
    return rows


def compare(reference_model, prompts, ref_tokens, tokens, logps, tolerance=LOGPROB_TOLERANCE):
    """How an answer (tokens, their log-probs) stands against the reference model's greedy answer. `equal_to_tie`:
    answers equal, or equal up to a first difference where the reference's top two log-probs are within
    `tolerance` (a choice the precision may flip; everything after it follows from it)."""
    forced = teacher_forced(reference_model, prompts, tokens)
    worst, mismatches, ties, to_tie = 0.0, 0, 0, 0
    for row, answer, ref, lp in zip(forced, tokens, ref_tokens, logps, strict=True):
        first = next((j for j, (a, b) in enumerate(zip(answer, ref, strict=False)) if a != b), None)
        to_tie += first is None or row["margin"][first] < tolerance
        for j, t in enumerate(answer):
            worst = max(worst, abs(row["logp"][j] - lp[j]))
            if row["argmax"][j] != t:
                if row["margin"][j] < TIE_MARGIN:
                    ties += 1
                else:
                    mismatches += 1
    return {"tokens_equal": sum(a == b for a, b in zip(ref_tokens, tokens, strict=True)), "equal_to_tie": to_tie,
            "prompts": len(prompts),
            "worst_logprob_diff": round(worst, 4), "argmax_mismatches": mismatches, "near_ties": ties}


def differing(a, b):
    return sum(x != y for x, y in zip(a, b, strict=False))


# -- vLLM ---------------------------------------------------------------------------------------------------------


def engine_job(spec, save=lambda result: None):
    """One vLLM engine (this process): spec's requests, each a name and an adapter folder or None; returns
    {name: {"tokens", "logps"} or {"error"}} and the tokens/s figures when spec asks for them."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    kwargs = {"model": spec["model"], "dtype": spec.get("dtype", "bfloat16"), "max_model_len": 512,
              "gpu_memory_utilization": 0.35, "max_num_seqs": 64, "seed": 0, "enforce_eager": spec.get("eager", False)}
    if spec.get("max_lora_rank"):
        kwargs.update(enable_lora=True, max_lora_rank=spec["max_lora_rank"], max_loras=2)
    if spec.get("multimodal"):
        kwargs["limit_mm_per_prompt"] = {"image": 0, "video": 0}
        if importlib.util.find_spec("flashinfer") is None:  # vLLM's default Gated DeltaNet prefill on Hopper
            kwargs["gdn_prefill_backend"] = "triton"
    t = time.time()
    llm = LLM(**kwargs)
    result = {"start_s": round(time.time() - t, 1), "answers": {}}
    params = SamplingParams(temperature=0.0, max_tokens=spec["new_tokens"], ignore_eos=True, logprobs=1,
                            detokenize=False)
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    loras = {}
    for i, (name, adapter) in enumerate(spec["requests"]):
        lora = LoRARequest(name, i + 1, adapter) if adapter else None
        loras[name] = lora
        try:
            outs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
            answers = [o.outputs[0] for o in outs]
            result["answers"][name] = {
                "tokens": [list(a.token_ids) for a in answers],
                "logps": [[lp[t].logprob for lp, t in zip(a.logprobs, a.token_ids, strict=True)] for a in answers]}
        except Exception as exc:  # noqa: BLE001 (what vLLM says is the finding)
            result["answers"][name] = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
        save(result)  # what came before survives an engine that dies on the next request
    if spec.get("throughput"):
        result["tokens_per_s"] = throughput(llm, spec, loras[spec["throughput"]])
    return result


def throughput(llm, spec, lora):
    """Generated tokens/s at batch 1 and 32 (128 new tokens each, the best of 3), base and with the adapter."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True, detokenize=False)
    figures = {}
    for batch in (1, 32):
        prompts = [{"prompt_token_ids": spec["prompts"][i % len(spec["prompts"])]} for i in range(batch)]
        for name, request in (("base", None), ("adapter", lora)):
            llm.generate(prompts, params, lora_request=request, use_tqdm=False)  # warm
            best = 0.0
            for _ in range(3):
                t = time.perf_counter()
                outs = llm.generate(prompts, params, lora_request=request, use_tqdm=False)
                n = sum(len(o.outputs[0].token_ids) for o in outs)
                best = max(best, n / (time.perf_counter() - t))
            figures[f"batch{batch}_{name}"] = round(best, 1)
        figures[f"batch{batch}_adapter_over_base"] = round(figures[f"batch{batch}_adapter"]
                                                           / figures[f"batch{batch}_base"], 3)
    return figures


def gpu_env():
    """This environment less TRITON_INTERPRET (the tests' CPU setting), which vLLM's kernels must not run under;
    vLLM's FlashInfer sampler off unless asked for (greedy needs none, and FlashInfer may not be installed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    return env


def run_engine(out, tag, spec, timeout=420):
    """engine_job in a process of its own (each engine gets a fresh GPU context); its result, or why none."""
    path = out / f"engine-{tag}.json"
    (out / f"spec-{tag}.json").write_text(json.dumps(spec))
    log = open(out / f"engine-{tag}.log", "w")
    t = time.time()
    try:
        done = subprocess.run([sys.executable, __file__, "_engine", str(out / f"spec-{tag}.json"), str(path)],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=gpu_env())
        rc = done.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    print(f"engine {tag}: rc {rc} in {time.time() - t:.0f} s", flush=True)
    tail = (out / f"engine-{tag}.log").read_text()[-2500:]
    result = json.loads(path.read_text()) if path.exists() else {}
    if rc != 0:
        result["error"] = f"engine rc {rc}: {tail}"
    return result


def serve_check(out, plan, family, adapter_dir, rank, reference):
    """The OpenAI server started with the serving box's command line (its tensor-parallel lines and its `vllm
    serve` line run by bash as the start script runs them), asked for the adapter's greedy completions."""
    from fleet.inference.adapter_fetch import RANKS

    serve = serve_line()
    root = out / "server"
    root.mkdir(exist_ok=True)
    port = 8765
    served_rank = next((r for r in RANKS if r >= rank), RANKS[-1])  # what the box's fetch program prints
    script = "\n".join(["set -eu", *serve["tensor_parallel"],
                        serve["command"].replace("$BASE", shlex.quote(plan["families"][family]["base"]))
                        .replace("$PORT", str(port)), "echo $! > \"$root/pid\""])
    env = {**gpu_env(), "root": str(root), "adapter": adapter_dir, "rank": str(served_rank)}
    t = time.time()
    subprocess.run(["bash", "-c", script], env=env, check=True, start_new_session=True)
    result = {"command": serve["command"], "rank": served_rank}
    try:
        listing = None
        while time.time() - t < 300 and alive(root / "pid"):
            try:
                models = urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
                listing = json.loads(models.read())
                break
            except OSError:
                time.sleep(2)
        result["ready_s"] = round(time.time() - t, 1)
        if listing is None:
            result["error"] = "not serving: " + (root / "vllm.log").read_text()[-2500:]
            return result
        result["models"] = [(m["id"], m.get("parent")) for m in listing["data"]]
        body = json.dumps({"model": serve["name"], "prompt": plan["prompts"], "max_tokens": plan["sizes"]["new_tokens"],
                           "temperature": 0, "logprobs": 1, "ignore_eos": True, "return_tokens_as_token_ids": True})
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body.encode(),
                                         {"Content-Type": "application/json"})
        answer = urllib.request.urlopen(request, timeout=120).read()  # noqa: S310 (our own local server)
        choices = sorted(json.loads(answer)["choices"], key=lambda c: c["index"])
        tokens = [[int(s.removeprefix("token_id:")) for s in c["logprobs"]["tokens"]] for c in choices]
        logps = [c["logprobs"]["token_logprobs"] for c in choices]
        result.update(reference(tokens, logps))
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}"[:1500] + " " + (root / "vllm.log").read_text()[-1500:]
    finally:
        pid = int((root / "pid").read_text()) if (root / "pid").exists() else None
        if pid:
            try:
                os.killpg(os.getpgid(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
            time.sleep(5)
    return result


def alive(pid_file):
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def check(out, plan, dtype="bfloat16", families=FAMILIES):
    """Every family x layout: vLLM (without CUDA or vLLM, only the merged weights in transformers) against peft."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    vllm_ok, why = vllm_here()
    rows, extra = [], {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                       "vllm": why if not vllm_ok else vllm_version(), "tolerance": LOGPROB_TOLERANCE,
                       "tie_margin": TIE_MARGIN, "dtype": dtype}
    for family, entry in plan["families"].items():
        if family not in families:
            continue
        try:
            check_family(out, plan, family, entry, device, vllm_ok, rows, extra, dtype)
        except Exception as exc:  # noqa: BLE001 (the other family still runs; the error is a figure)
            rows.append({"family": family, "layout": "all", "error": f"{type(exc).__name__}: {exc}"[:1500]})
        report(out, plan, rows, extra, final=False)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows, extra


def check_family(out, plan, family, entry, device, vllm_ok, rows, extra, dtype="bfloat16"):
    prompts, n_new = plan["prompts"], plan["sizes"]["new_tokens"]
    exports = entry["exports"]
    engines = {}
    served = dtype == "bfloat16"  # as a box serves: the server, the timings and peft's layout are checked there
    layouts = LAYOUTS if served else ("vllm", "merged")
    if vllm_ok:
        base_spec = {"prompts": prompts, "new_tokens": n_new, "multimodal": family == "qwen3_5_moe", "dtype": dtype}
        timed = served and family == "qwen3_moe"  # tokens/s with CUDA graphs, as a box serves; others eager
        engines["lora"] = run_engine(out, f"{family}-{dtype}-lora", {
            **base_spec, "model": entry["base"], "max_lora_rank": entry["r"], "eager": not timed,
            "requests": [("base", None), ("vllm", exports["vllm"])], "throughput": "vllm" if timed else None})
        if "peft" in layouts:  # its own engine: peft's layout of a 2-D MoE model fails an assertion that ends it
            engines["peft"] = run_engine(out, f"{family}-{dtype}-peft", {
                **base_spec, "model": entry["base"], "max_lora_rank": entry["r"], "eager": True,
                "requests": [("peft", exports["peft"])]})
        engines["merged"] = run_engine(out, f"{family}-{dtype}-merged", {
            **base_spec, "model": exports["merged"], "eager": True, "requests": [("merged", None)]})
    peft_model = hf_model(entry["base"], exports["peft"], device, dtype)
    ref_tokens, _ = hf_greedy(peft_model, prompts, n_new)
    with peft_model.disable_adapter():
        base_tokens, _ = hf_greedy(peft_model, prompts, n_new)
    hf_differs = differing(ref_tokens, base_tokens)
    if not vllm_ok:
        merged = hf_model(exports["merged"], None, device, dtype)
        tokens, logps = hf_greedy(merged, prompts, n_new)
        rows.append({"family": family, "layout": "merged (transformers)",
                     **compare(peft_model, prompts, ref_tokens, tokens, logps),
                     "adapter_in_effect": {"served_differs": differing(tokens, base_tokens),
                                           "peft_differs": hf_differs}})
        return
    lora = engines["lora"]
    served_base = lora.get("answers", {}).get("base", {})
    for layout in layouts:
        source = engines[layout if layout != "vllm" else "lora"]
        answer = source.get("answers", {}).get(layout) or {"error": source.get("error", "no answer")}
        row = {"family": family, "layout": layout}
        if "error" in answer:
            row["error"] = answer["error"]
        else:
            row.update(compare(peft_model, prompts, ref_tokens, answer["tokens"], answer["logps"]))
            row["adapter_in_effect"] = {"served_differs": differing(answer["tokens"], served_base.get("tokens", [])),
                                        "peft_differs": hf_differs}
        rows.append(row)
    if served_base and "error" not in served_base:
        with peft_model.disable_adapter():
            rows.append({"family": family, "layout": "none (base)",
                         **compare(peft_model, prompts, base_tokens, served_base["tokens"], served_base["logps"])})
    if lora.get("tokens_per_s"):
        extra[f"{family}_tokens_per_s"] = lora["tokens_per_s"]
    extra[f"{family}_engine_start_s"] = {k: e.get("start_s") for k, e in engines.items()}
    if timed:  # the OpenAI server once, as a box starts it
        extra["server"] = serve_check(out, plan, family, exports["vllm"], entry["r"],
                                      functools.partial(compare, peft_model, prompts, ref_tokens))


def vllm_here():
    import torch

    if not torch.cuda.is_available():
        return False, "skipped: no CUDA device"
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        return False, f"skipped: vLLM is not installed ({exc})"
    return True, ""


def vllm_version():
    import vllm

    return vllm.__version__


def table(rows):
    lines = [f"{'family':12} {'layout':22} {'equal':>7} {'to tie':>6} {'worst dlogp':>11} {'mismatch':>8} {'ties':>5} "
             f"{'adapter differs (served/peft)':>30}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['family']:12} {r['layout']:22} ERROR {r['error'][:300]}")
            continue
        effect = r.get("adapter_in_effect")
        eff = f"{effect['served_differs']}/{effect['peft_differs']}" if effect else "-"
        lines.append(f"{r['family']:12} {r['layout']:22} {r['tokens_equal']:>3}/{r['prompts']:<3} "
                     f"{r['equal_to_tie']:>6} {r['worst_logprob_diff']:>11} {r['argmax_mismatches']:>8} "
                     f"{r['near_ties']:>5} {eff:>30}")
    return "\n".join(lines)


def report(out, plan, rows, extra, final=True):
    if final:
        print(table(rows))
    figures = {"rows": rows, **extra, "new_tokens": plan["sizes"]["new_tokens"],
               "families": {f: {k: e[k] for k in ("r", "factors", "zero_factors", "train_s")}
                            for f, e in plan["families"].items()}}
    (out / "result.json").write_text(json.dumps(figures, indent=1))
    if final:
        print(json.dumps(figures))


def load_plan(out):
    """plan.json, its paths moved to where `out` is now (prepare may have run on another machine)."""
    text = (out / "plan.json").read_text()
    was = json.loads(text)["out"]
    return json.loads(text.replace(json.dumps(was)[1:-1], json.dumps(str(out))[1:-1]))


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "_engine":
        path = Path(sys.argv[3])
        result = engine_job(json.loads(Path(sys.argv[2]).read_text()), lambda r: path.write_text(json.dumps(r)))
        path.write_text(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", nargs="?", choices=("prepare", "check"), help="one stage only (default both)")
    parser.add_argument("out", nargs="?", help="the folder to write (with --smoke: a temporary one if left out)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; vLLM only where CUDA and vLLM are")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="what vLLM and the reference compute in (check)")
    parser.add_argument("--family", choices=FAMILIES, action="append", help="check only this family (repeatable)")
    args = parser.parse_args()
    if args.stage and not args.out:
        args.out, args.stage = args.stage, None  # `serve_check.py OUT`
    if args.out is None and not args.smoke:
        parser.error("OUT is needed")
    sizes = SMOKE_SIZES if args.smoke else SIZES
    with tempfile.TemporaryDirectory(prefix="serve-check-") as scratch:
        out = Path(args.out or scratch).resolve()
        plan = prepare(out, sizes) if args.stage in (None, "prepare") else load_plan(out)
        if args.stage == "prepare":
            print(json.dumps({"prepared": str(out), "families": list(plan["families"])}))
            return 0
        rows, extra = check(out, plan, args.dtype, tuple(args.family or FAMILIES))
        report(out, plan, rows, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
