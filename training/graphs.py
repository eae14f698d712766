"""Micro-steps (forward, loss, backward) captured in CUDA graphs and replayed: no Python, no launch overhead
(docs/training.md, "training/graphs.py")."""

import logging
import traceback
from pathlib import Path

import torch

_log = logging.getLogger(__name__)

GRAPH_SAFE = frozenset({"cpt", "sft", "dpo", "kto"})  # their losses never read a device value on the host


def eager_micro_step(model, loss_fn, batch, phase, ctx, scale):
    """The plain micro-step: loss, backward of loss * scale; returns (loss, stats)."""
    loss, stats = loss_fn(model, batch, phase, ctx)
    (loss * scale).backward()
    return loss.detach(), stats


def _signature(batch, kind, scale):
    parts = [kind, scale]
    for key in sorted(batch):
        value = batch[key]
        if not torch.is_tensor(value):
            return None  # lists and other host values: not a fixed graph input
        parts.append((key, tuple(value.shape), value.dtype, value.device))
    return tuple(parts)


class _Captured:
    def __init__(self, graph, inputs, loss, stats):
        self.graph, self.inputs, self.loss, self.stats = graph, inputs, loss, stats

    def replay(self, batch):
        for key, static in self.inputs.items():
            static.copy_(batch[key], non_blocking=True)
        self.graph.replay()
        stats = {k: v.clone() if torch.is_tensor(v) else v for k, v in self.stats.items()}
        return self.loss.clone(), stats


def _where(exc, frames=3):
    """The innermost frames an exception came through, "file:line function", innermost first: which op a capture
    refused."""
    stack = traceback.extract_tb(exc.__traceback__)[-frames:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(stack)) or "unknown"


class MicroStepGraphs:
    """Per batch signature: `warmup` eager micro-steps, then one capture, then replays; at most `max_graphs`
    captured per phase kind."""

    def __init__(self, params, warmup=2, max_graphs=4):
        self.params = list(params)
        self.warmup, self.max_graphs = warmup, max_graphs
        self.captured, self.failed, self.seen = {}, set(), {}
        self.pool = None
        self.side = torch.cuda.Stream()

    @property
    def replaying(self):
        return bool(self.captured)

    def zero_grads(self):
        """In place: captured graphs write into these very tensors."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    def run(self, model, loss_fn, batch, phase, ctx, scale):
        kind = phase["kind"]
        key = _signature(batch, kind, scale) if kind in GRAPH_SAFE else None
        captured = self.captured.get(key)
        if captured is not None:
            return captured.replay(batch)
        if key is None or key in self.failed or sum(k[0] == kind for k in self.captured) >= self.max_graphs:
            return eager_micro_step(model, loss_fn, batch, phase, ctx, scale)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] <= self.warmup:
            return self._on_side_stream(eager_micro_step, model, loss_fn, batch, phase, ctx, scale)
        try:
            captured = self._capture(model, loss_fn, batch, phase, ctx, scale)
        except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: this shape runs eagerly from now on
            _log.warning("micro-step not captured in a CUDA graph (%s: %s, at %s); running it eagerly",
                         type(exc).__name__, str(exc)[:200], _where(exc))
            self.failed.add(key)
            torch.cuda.synchronize()
            return eager_micro_step(model, loss_fn, batch, phase, ctx, scale)
        self.captured[key] = captured
        _log.info("micro-step captured in a CUDA graph for %s", key)
        return captured.replay(batch)

    def _on_side_stream(self, fn, *args):
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            result = fn(*args)
        torch.cuda.current_stream().wait_stream(self.side)
        return result

    def _capture(self, model, loss_fn, batch, phase, ctx, scale):
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        inputs = {key: value.clone() for key, value in batch.items()}
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the eager warm-up's cached blocks go back before the graph's pool is made
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            loss, stats = eager_micro_step(model, loss_fn, inputs, phase, ctx, scale)
        if self.pool is None:
            self.pool = graph.pool()
        return _Captured(graph, inputs, loss, stats)
