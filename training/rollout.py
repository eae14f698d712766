"""GRPO's rollouts: sampling completions from a preallocated KV cache, each decode step replayed from a CUDA graph
(docs/training.md, "training/rollout.py")."""

import inspect
import logging
from collections import OrderedDict

import torch
import torch.nn.functional as F
from transformers import StaticCache
from transformers.cache_utils import get_layer_types_and_kwargs

from training import attention
from training.head_loss import head_and_body

_log = logging.getLogger(__name__)

WARMUP_STEPS = 2  # eager decode steps of a shape before its capture (Triton autotuning, cuBLAS and allocator)
CHECK_EVERY = 8  # decode steps between the host's looks at whether every row has ended
CAPACITY_MULTIPLE = 64  # cache lengths rounded up to it, so that prompts of nearby widths share a cache and graph
KEPT_SHAPES = 2  # decoders (cache and graph) kept per model, the least recently used dropped first
DECODERS_ATTRIBUTE = "_rollout_decoders"  # on the causal LM, a plain attribute: not a submodule, not in the state


def static_decode_fits(config) -> bool:
    """Whether the cache and mask built here are the model's: every layer full attention, read through sdpa, eager
    or packed_sdpa attention (all take the additive 4-D mask; packed_sdpa hands it to sdpa)."""
    text = config.get_text_config(decoder=True)
    layer_types = get_layer_types_and_kwargs(text)[0]
    return (all(kind == "full_attention" for kind in layer_types)
            and text._attn_implementation in ("sdpa", "eager", attention.NAME))


def capacity_for(width: int, max_new_tokens: int) -> int:
    """The cache length for prompts `width` tokens wide and their completions."""
    return -(-(width + max_new_tokens) // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE


@torch.no_grad()
def sample(model, input_ids, attention_mask, max_new_tokens, temperature, eos_token_id, pad_token_id, generator=None):
    """Completions (B, max_new_tokens) of the left-padded prompts `input_ids` (B, W), sampled at `temperature` (0:
    greedy); a row ends at its first eos (docs/training.md, "training/rollout.py")."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    was_training = model.training
    model.eval()
    try:
        if not static_decode_fits(causal.config):
            return _transformers_generate(model, input_ids, attention_mask, max_new_tokens, temperature,
                                          eos_token_id, pad_token_id)
        rows, width = input_ids.shape
        decoder = _decoder(causal, rows, capacity_for(width, max_new_tokens), max_new_tokens, temperature == 0,
                           input_ids.device)
        seed_device = generator.device if generator is not None else "cpu"
        seed = int(torch.randint(0, 2**62, (), generator=generator, device=seed_device))
        step = _Step(model, causal)
        decoder.start(step, input_ids, attention_mask, temperature, eos_token_id, pad_token_id, seed)
        return decoder.finish(step, max_new_tokens)
    finally:
        model.train(was_training)


def _transformers_generate(model, input_ids, attention_mask, max_new_tokens, temperature, eos_token_id, pad_token_id):
    sampling = {"do_sample": False}
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                         pad_token_id=pad_token_id, eos_token_id=eos_token_id, **sampling)
    completions = out[:, input_ids.shape[1]:]
    return F.pad(completions, (0, max_new_tokens - completions.shape[1]), value=pad_token_id)


class _Step:
    """The model's forward as a decode step calls it: the last position's logits, with the cache."""

    def __init__(self, model, causal):
        self.model, self.causal, self.parts = model, causal, head_and_body(model)
        parameters = inspect.signature(type(causal).forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"  # named so up to 5.18 at least

    def last_logits(self, cache, input_ids, position_ids, attention_mask):
        inputs = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": attention_mask,
                  self.cache_argument: cache, "use_cache": True}
        if self.parts is None:  # a head that does more than one matmul: the model's own, on the last position
            return self.model(**inputs, logits_to_keep=1).logits[:, -1]
        body, head = self.parts
        return head(body(**inputs).last_hidden_state[:, -1])


def release(model) -> int:
    """Drop the model's kept caches and graphs (the GRPO phase is over: its memory goes back to training); returns how
    many were dropped."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    kept = causal.__dict__.pop(DECODERS_ATTRIBUTE, None) or {}
    dropped = len(kept)
    kept.clear()
    if dropped and torch.cuda.is_available():
        torch.cuda.empty_cache()
    return dropped


def _decoder(causal, rows, capacity, max_new_tokens, greedy, device):
    """The model's decoder for this shape, made if it has none; the least recently used beyond KEPT_SHAPES dropped."""
    kept = causal.__dict__.setdefault(DECODERS_ATTRIBUTE, OrderedDict())
    key = (rows, capacity, max_new_tokens, greedy, device)
    decoder = kept.pop(key, None)
    if decoder is None:
        dtype = causal.get_input_embeddings().weight.dtype
        pool = next((d.pool for d in kept.values() if d.pool is not None), None)
        decoder = _Decoder(causal.config, rows, capacity, max_new_tokens, greedy, device, dtype, pool)
    kept[key] = decoder
    while len(kept) > KEPT_SHAPES:
        kept.popitem(last=False)
    decoder.check_weights(causal)
    return decoder


class _Decoder:
    """One rollout shape's cache, the buffers its decode step reads and writes in place, and once captured the
    step's graph. pool: a graph pool to share (the decoders of one model never replay at once)."""

    def __init__(self, config, rows, capacity, max_new_tokens, greedy, device, dtype, pool):
        self.cache = StaticCache(config=config, max_cache_len=capacity)
        self.greedy, self.device, self.pool = greedy, device, pool
        longs = dict(dtype=torch.long, device=device)
        self.token = torch.zeros(rows, 1, **longs)  # what the next step feeds
        self.position = torch.zeros(rows, 1, **longs)
        self.slot = torch.zeros((), **longs)  # the cache slot the next step writes
        self.slots = torch.arange(capacity, **longs)
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=device)  # the slots each row attends to
        self.column = torch.zeros((), **longs)  # the completion column the next token goes to
        self.completions = torch.zeros(rows, max_new_tokens, **longs)
        self.ended = torch.zeros(rows, dtype=torch.bool, device=device)
        self.eos, self.pad = torch.zeros((), **longs), torch.zeros((), **longs)
        self.inverse_temperature = torch.ones((), dtype=torch.float32, device=device)
        self.attend = torch.zeros((), dtype=dtype, device=device)  # the additive mask's two values
        self.ignore = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
        self.generator = torch.Generator(device=device)
        self.graph, self.weights, self.capture_failed, self.eager_steps = None, None, False, 0
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def check_weights(self, causal):
        """Drop the graph if a parameter is no longer where it read it."""
        if self.graph is not None and self.weights != _addresses(causal):
            self.graph, self.eager_steps = None, 0

    def start(self, step, input_ids, attention_mask, temperature, eos_token_id, pad_token_id, seed):
        """The prompts into the cache, eagerly, and the first token out; every buffer set for this rollout."""
        rows, width = input_ids.shape
        self.cache.reset()  # in place: the graph reads these very tensors
        self.generator.manual_seed(seed)
        self.inverse_temperature.fill_(1.0 / temperature if temperature > 0 else 1.0)
        self.eos.fill_(-1 if eos_token_id is None else eos_token_id)
        self.pad.fill_(pad_token_id)
        self.completions.fill_(pad_token_id)
        self.ended.zero_()
        self.column.zero_()
        real = attention_mask.bool()
        self.valid.zero_()
        self.valid[:, :width] = real
        # Each prompt position sees the real positions up to itself; a padding position sees nothing, and the
        # additive mask keeps its (unused) output finite.
        seen = real[:, None, :] & torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        mask = self.ignore.expand(rows, 1, width, self.valid.shape[1]).clone()
        mask[:, 0, :, :width] = torch.where(seen, self.attend, self.ignore)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        self._record(step.last_logits(self.cache, input_ids, positions, mask))
        self.slot.fill_(width)
        self.position.copy_(real.sum(-1, keepdim=True))

    def finish(self, step, max_new_tokens):
        """The decode steps, until every row has ended or the completions are full; the completions."""
        for made in range(1, max_new_tokens):
            if made % CHECK_EVERY == 0 and bool(self.ended.all()):
                break
            self._advance(step)
        return self.completions.clone()

    def _record(self, logits):
        scores = logits.float()
        if not self.greedy:  # Gumbel-max: -log of an exponential draw is a Gumbel draw
            noise = torch.empty_like(scores).exponential_(generator=self.generator)
            scores = scores * self.inverse_temperature - noise.log()
        token = torch.where(self.ended, self.pad, scores.argmax(-1))
        self.completions.index_copy_(1, self.column.view(1), token[:, None])
        self.ended |= token == self.eos
        self.token.copy_(token[:, None])
        self.column += 1

    def _decode_step(self, step):
        self.valid |= self.slots == self.slot
        mask = torch.where(self.valid, self.attend, self.ignore)[:, None, None, :]
        logits = step.last_logits(self.cache, self.token, self.position, mask)
        self.slot += 1
        self.position += 1
        self._record(logits)

    def _advance(self, step):
        if self.graph is not None:
            self.graph.replay()
        elif self.side is None or self.capture_failed:
            self._decode_step(step)
        elif self.eager_steps < WARMUP_STEPS:
            self.eager_steps += 1
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                self._decode_step(step)
            torch.cuda.current_stream(self.device).wait_stream(self.side)
        else:
            self._capture(step)

    def _capture(self, step):
        """Capture one decode step and replay it (the capture itself computes nothing); eager from now on if the
        capture fails."""
        graph = torch.cuda.CUDAGraph()
        try:
            graph.register_generator_state(self.generator)
            torch.cuda.synchronize(self.device)
            with torch.cuda.graph(graph, pool=self.pool, stream=self.side):
                self._decode_step(step)
        except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: this shape decodes eagerly
            _log.warning("rollout decode step not captured in a CUDA graph (%s: %s); decoding eagerly",
                         type(exc).__name__, str(exc)[:200])
            self.capture_failed = True
            torch.cuda.synchronize(self.device)
            self._decode_step(step)
            return
        self.graph, self.pool, self.weights = graph, graph.pool(), _addresses(step.causal)
        _log.info("rollout decode step captured in a CUDA graph for %d rows, cache of %d", *self.valid.shape)
        graph.replay()


def _addresses(model):
    return tuple(p.data_ptr() for p in model.parameters())
