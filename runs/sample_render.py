"""A data set's sample rendered and counted in a child process held to a time and a memory limit, so no chat template,
tokenizer or record can hold the launch request (docs/runs.md, "runs/sample_render.py")."""

import multiprocessing
import os
import resource
import signal
import time

from training import records
from training.recipe import EVAL_KIND

RECORD_SECONDS = 2.0  # one record's processor time: a real chat template renders one in milliseconds
RECORD_WALL_SECONDS = 3 * RECORD_SECONDS  # the same measured from outside, for a child stuck in native code
MEMORY_BYTES = 1024**3  # what the child may map beyond the launch process's own memory
SAMPLE_CHARS = 20_000  # of the rendered sample kept and shown
ERROR_CHARS = 500  # of a template's own error message


def rendered(kind: str, sample: list[tuple[int, dict]], tokenizer, *, seconds: float) -> tuple[list[dict], str]:
    """Each sample record measured in order, as {"line", "tokens", "trained", "segments" (the first only)} or
    {"line", "error"}, and why it stopped early ("" when it did not): a record over its time or the memory limit
    is an error; `seconds` over is a stop."""
    context = multiprocessing.get_context("fork")  # the child has the tokenizer without loading it again
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_render_all, args=(kind, sample, tokenizer, send), daemon=True)
    child.start()
    send.close()
    results: list[dict] = []
    end = time.monotonic() + seconds
    try:
        while len(results) < len(sample):
            line = sample[len(results)][0]
            wait = min(RECORD_WALL_SECONDS, end - time.monotonic())
            if wait <= 0 or not receive.poll(wait):
                if wait < RECORD_WALL_SECONDS:
                    return results, f"the check's time ran out after {len(results)} of {len(sample)} record(s)"
                results.append({"line": line, "error": f"rendering it took longer than {RECORD_WALL_SECONDS:g} s"})
                return results, "stopped at a record too slow to render"
            try:
                results.append(receive.recv())
                if results[-1].get("stop"):
                    return results, "stopped at a record too slow to render"
            except EOFError:  # the child died: killed for its memory, or the tokenizer's library aborted
                results.append({"line": line, "error": "rendering it needed more than the "
                                                       f"{MEMORY_BYTES // 1024**2:,} MiB of memory the check allows"})
                return results, "stopped at a record too large to render"
        return results, ""
    finally:
        child.kill()
        child.join()
        receive.close()


def _render_all(kind, sample, tokenizer, send) -> None:
    """The child: renders one record after another and sends each one's measure."""
    os.environ.update(TOKENIZERS_PARALLELISM="false")  # its threads' stacks and arenas would count against the limit
    _limit_memory(MEMORY_BYTES)
    signal.signal(signal.SIGVTALRM, _too_slow)
    shown = False
    for number, record in sample:
        signal.setitimer(signal.ITIMER_VIRTUAL, RECORD_SECONDS)  # this process's own time: none lost to a busy host
        try:
            # An eval record is its prompt as generation starts from it, nothing trained: as a GRPO prompt renders.
            ids, labels = records.render_record("grpo" if kind == EVAL_KIND else kind, record, tokenizer)
            measure = {"line": number, "tokens": len(ids), "trained": sum(t != records.IGNORE for t in labels)}
            if not shown:
                measure["segments"] = records.trained_segments(tokenizer, ids, labels)
                measure.update(shown_sample(measure))
                shown = True
        except TooSlow:
            send.send({"line": number, "error": f"rendering it took longer than {RECORD_SECONDS:g} s of processor "
                                                "time (the chat template does too much work for one record)",
                       "stop": True})
            return
        except MemoryError:
            send.close()  # read as the memory limit, like a child killed for it
            return
        except Exception as exc:  # noqa: BLE001 - a template's own error (jinja, a missing key) names the line
            words = f"{type(exc).__name__}: {exc}"
            cut = f" ... ({len(words) - ERROR_CHARS:,} more characters)" if len(words) > ERROR_CHARS else ""
            measure = {"line": number, "error": f"the chat template cannot render it: {words[:ERROR_CHARS]}{cut}"}
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        send.send(measure)
    send.close()


class TooSlow(BaseException):
    """A record's render past RECORD_SECONDS: no Exception, which a template's caller may catch and render again."""


def _too_slow(signum, frame):
    raise TooSlow


def _limit_memory(extra_bytes: int) -> None:
    """Address space: what the child holds now (the parent's, shared) plus `extra_bytes`."""
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no /proc (not Linux): the time limit still holds
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + extra_bytes if hard == resource.RLIM_INFINITY else min(hard, mapped + extra_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def shown_sample(sample: dict) -> dict:
    """A sample's segments cut to SAMPLE_CHARS in all, `more_chars` counting every character left out (0 when none):
    what is stored, and what is shown, for a sample stored whole before this limit too."""
    kept, left = [], SAMPLE_CHARS
    total = sum(len(text) for text, _ in sample.get("segments") or [])
    for text, trained in sample.get("segments") or []:
        if left <= 0:
            break
        kept.append([text[:left], trained])
        left -= len(text)
    return {**sample, "segments": kept, "more_chars": sample.get("more_chars", 0) + max(0, total - SAMPLE_CHARS)}
