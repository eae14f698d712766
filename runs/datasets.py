"""Data sets: each phase's JSONL checked before anything is rented, stored once in the run's bucket, kept for reuse.

A phase's `data` is a file uploaded with the launch or a name its user stored, an s3:// object, or `example:<file>`
(docs/runs.md, "runs/datasets.py").
"""

import hashlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import botocore.exceptions
from django.conf import settings
from django.db import IntegrityError, transaction

from runs import sample_render, sharing, storage
from runs.models import DataSet, DataSetName
import training
from training import records

EXAMPLE_PREFIX = "example:"
EXAMPLES = Path(training.__file__).resolve().parent / "examples"
MAX_ERRORS = 20  # per file: enough to see a pattern, few enough to read
SAMPLE_RECORDS = 200  # rendered and counted in tokens; every line is checked, within CHECK_SECONDS
CHECK_SECONDS = 15.0  # a launch's data checks together: the web server answers within 30 s
RENDER_MAX_BYTES = 256 * 1024  # a longer record is checked, not rendered in the sample
NAME_MAX = DataSet._meta.get_field("name").max_length  # a data set's name: an upload's file name or its s3:// URI


class DataError(ValueError):
    """The phases' data is not usable; the message lists every problem found."""


@dataclass
class Inspection:
    sha256: str
    size_bytes: int
    rows: int
    errors: list[str] = field(default_factory=list)
    report: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Tokenizer:
    """The model's tokenizer as far as the dashboard could load it: `tokenizer` None when it could not."""

    tokenizer: object
    name: str
    note: str = ""


def model_tokenizer(model: dict) -> Tokenizer:
    """The tokenizer the trainer will use for this recipe's model, loaded here (a hub id's files are fetched once
    into the local cache). A model the dashboard cannot read is said, not refused: the box may still reach it."""
    config = model.get("config") or {}
    vocab_size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size") or 151936
    name = model.get("tokenizer") or model.get("path") or f"bytes (vocabulary {vocab_size})"
    try:
        tokenizer = records.load_tokenizer(model, vocab_size)
    except ImportError:
        return Tokenizer(None, name, "the dashboard has no tokenizer library (transformers): token counts and the "
                                     "chat template were not checked")
    except Exception as exc:  # noqa: BLE001 - a hub or a folder fails in many ways; the launch says which, and goes on
        return Tokenizer(None, name, f"the tokenizer of {name} could not be loaded here ({exc}): token counts and "
                                     "the chat template were not checked")
    if not getattr(tokenizer, "chat_template", None):
        return Tokenizer(tokenizer, name, "the model has no chat template: conversations are rendered in the plain "
                                          "<|role|> format the trainer falls back to; the template check was skipped")
    return Tokenizer(tokenizer, name)


def check_file(path: Path, kind: str, tokenizer: Tokenizer, deadline: float | None = None) -> Inspection:
    """Every line of a phase's JSONL checked for its kind until `deadline` (time.monotonic(); CHECK_SECONDS from now
    when None), its first SAMPLE_RECORDS of at most RENDER_MAX_BYTES rendered and counted within the rest of it
    (docs/runs.md, "runs/datasets.py")."""
    deadline = time.monotonic() + CHECK_SECONDS if deadline is None else deadline
    sha, size, rows, errors = hashlib.sha256(), 0, 0, []
    sample: list[tuple[int, dict]] = []  # (line number, record)
    unchecked_from, too_large = None, []  # the first line left unchecked; lines too large to render
    limit = min(settings.DATASET_MAX_LINE_BYTES, records.MAX_RECORD_BYTES)
    with open(path, "rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(limit + 1), b""), 1):
            if len(raw) > limit and not raw.endswith(b"\n"):
                errors.append(f"line {number} is longer than {limit:,} bytes (DATASET_MAX_LINE_BYTES): not read on")
                break
            sha.update(raw)
            size += len(raw)
            if not raw.strip():
                continue
            if unchecked_from is not None:  # hashed and counted, not parsed: the check's time is spent
                rows += 1
                continue
            problems = _line_problems(kind, raw, limit)
            if isinstance(problems, dict):
                rows += 1
                if len(raw) > RENDER_MAX_BYTES:
                    too_large.append(number)
                elif len(sample) < SAMPLE_RECORDS:
                    sample.append((number, problems))
            else:
                errors += [f"line {number}: {p}" for p in problems]
            if time.monotonic() > deadline:
                unchecked_from = number + 1
    if not rows and not errors:
        errors.append("no records: the file is empty")
    notes = [tokenizer.note] if tokenizer.note else []
    if unchecked_from is not None and rows > 0:
        notes.append(f"lines {unchecked_from:,} on were not checked here: a launch checks its data for at most "
                     f"{CHECK_SECONDS:g} s (the box checks every record before it trains)")
    if too_large:
        more = f" and {len(too_large) - 1:,} more" if len(too_large) > 1 else ""
        notes.append(f"line {too_large[0]:,}{more} not rendered here: a launch renders records of at most "
                     f"{RENDER_MAX_BYTES:,} bytes (the box renders every record)")
    report: dict = {"tokenizer": tokenizer.name, "notes": notes}
    if tokenizer.tokenizer is not None and sample and not errors:
        report.update(_measured(kind, sample, tokenizer.tokenizer, errors, deadline, notes))
    return Inspection(sha.hexdigest(), size, rows, _capped(errors), report)


def _line_problems(kind: str, raw: bytes, limit: int):
    """The record, or the problems of its line."""
    try:
        record = records.parse_record(raw, limit)
    except records.RecordUnreadable as exc:
        return [str(exc)]
    problems = records.record_problems(kind, record)
    return problems or record


def _measured(kind: str, sample: list[tuple[int, dict]], tokenizer, errors: list[str], deadline: float,
              notes: list[str]) -> dict:
    """The sample rendered in a bounded child (runs/sample_render.py): its counts; its errors and stops said."""
    results, stopped = sample_render.rendered(kind, sample, tokenizer, seconds=deadline - time.monotonic())
    tokens, trained, longest, measured, shown = 0, 0, 0, 0, None
    for result in results:
        if "error" in result:
            errors.append(f"line {result['line']}: {result['error']}")
            continue
        measured += 1
        tokens, longest = tokens + result["tokens"], max(longest, result["tokens"])
        trained += result["trained"]
        if "segments" in result:
            shown = {"line": result["line"], "segments": result["segments"], "more_chars": result["more_chars"]}
    if stopped and not errors:
        notes.append(f"{measured} of the first {len(sample)} record(s) rendered: {stopped}")
    return {"records_measured": measured, "tokens_measured": tokens, "trained_tokens_measured": trained,
            "longest_tokens": longest, "sample": shown}


def _capped(errors: list[str]) -> list[str]:
    if len(errors) <= MAX_ERRORS:
        return errors
    return errors[:MAX_ERRORS] + [f"... and {len(errors) - MAX_ERRORS} more"]


# -- a launch's data --------------------------------------------------------------------------------------------

def resolve(recipe: dict, bucket: str, uploads: dict, *, user=None, now) -> list[DataSet]:
    """One stored DataSet per phase of a checked recipe (in order), or DataError with every problem at once (and
    nothing stored). `uploads` maps a file name to a Django uploaded file; `user` is who launches (None: the
    product), whose own stored data sets in `bucket` are the only ones a name finds (_stored)."""
    tokenizer, deadline = None, time.monotonic() + CHECK_SECONDS
    found: list[DataSet | tuple[Inspection, Path, str, str]] = []  # stored, or checked and to be kept
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="launch-data-") as scratch:
        for i, phase in enumerate(recipe["phases"]):
            label = phase.get("where") or f"phases[{i}] ({phase['name']}).data"  # held-out data names its own
            where, source = f"{label} {phase['data']}", phase["data"]
            stored = None if source in uploads else _stored(source, phase["kind"], bucket, user)
            if stored is not None:
                found.append(stored)
                continue
            if source not in uploads and _is_a_name(source):
                problems.append(f"{where}: {_not_stored(source, phase['kind'], bucket, user)}")
                continue
            name = Path(source).name if "://" not in source else source
            if len(name) > NAME_MAX:
                problems.append(f"{where}: its name is {len(name)} characters; a data set's is at most {NAME_MAX}")
                continue
            try:
                path = _fetched(source, uploads, Path(scratch) / f"{i}.jsonl", phase["kind"], user, bucket)
            except DataError as exc:
                problems.append(f"{where}: {exc}")
                continue
            tokenizer = tokenizer or model_tokenizer(recipe["model"])
            checked = check_file(path, phase["kind"], tokenizer, deadline)
            if checked.errors:
                problems += [f"{where}: {e}" for e in checked.errors]
                continue
            found.append((checked, path, name, phase["kind"]))
        if problems:  # nothing is stored unless every phase's data is usable
            raise DataError("The data is not usable ({} problem(s)):\n  - {}".format(len(problems),
                                                                                     "\n  - ".join(problems)))
        return [item if isinstance(item, DataSet) else _kept(*item, bucket, user, now) for item in found]


def resolve_with_held_out(recipe: dict, bucket: str, uploads: dict, *, user=None,
                          now) -> tuple[list[DataSet], dict[int, DataSet]]:
    """`resolve` for every phase's data and, in the same check, each training phase's held-out `eval_data` (the
    same sources, checked as that phase's kind): (data sets in phase order, {phase index: held-out data set})."""
    held = [(i, phase) for i, phase in enumerate(recipe["phases"]) if phase.get("eval_data")]
    sources = [*recipe["phases"], *({"name": phase["name"], "kind": phase["kind"], "data": phase["eval_data"],
                                     "where": f"phases[{i}] ({phase['name']}).eval_data"} for i, phase in held)]
    stored = resolve({**recipe, "phases": sources}, bucket, uploads, user=user, now=now)
    count = len(recipe["phases"])
    return stored[:count], {i: stored[count + j] for j, (i, _) in enumerate(held)}


def _is_a_name(source: str) -> bool:
    """A phase's data that names a stored data set: no example, no s3:// object, no path."""
    return not source.startswith(EXAMPLE_PREFIX) and "://" not in source and "/" not in source


def _stored(name: str, kind: str, bucket: str, user) -> DataSet | None:
    """The newest data set of this kind that `user` stored under `name` in `bucket` (DataSetName), or None. Only the
    user's own names in the run's bucket count (docs/runs.md, "runs/datasets.py")."""
    if not _is_a_name(name):
        return None
    named = DataSetName.objects.filter(name=name, user=user, dataset__bucket=bucket, dataset__kind=kind)
    found = named.select_related("dataset").order_by("-stored_at", "-id").first()
    return found.dataset if found is not None else None


def _not_stored(name: str, kind: str, bucket: str, user) -> str:
    """Why a name found nothing, saying what the user's own names hold and nothing of anyone else's."""
    own = DataSetName.objects.filter(name=name, user=user).select_related("dataset")
    elsewhere = sorted({n.dataset.bucket for n in own if n.dataset.kind == kind and n.dataset.bucket != bucket})
    kinds = sorted({n.dataset.kind for n in own if n.dataset.bucket == bucket and n.dataset.kind != kind})
    seen = []
    if elsewhere:
        seen.append(f"yours of that name is stored in {', '.join(elsewhere)}, which this run's boxes are not granted")
    if kinds:
        seen.append(f"yours of that name in this bucket was checked as {', '.join(kinds)} data, not {kind}")
    return (f"is neither a file uploaded with this launch nor a {kind} data set you stored under that name in this "
            f"run's bucket{' (' + '; '.join(seen) + ')' if seen else ''}: a data set is reused by name only by the "
            "user who stored it, in its own bucket, and no one else's is used. Upload the file with this launch, or "
            "name an s3://bucket/key object")


def _fetched(source: str, uploads: dict, dest: Path, kind: str, user, bucket: str) -> Path:
    """The phase's file on this machine, for checking: an upload, an s3:// object (in the product's own storage only
    the user's own data set: runs.sharing.may_import, asked before anything is read) or an example."""
    if source in uploads:
        with open(dest, "wb") as f:
            for chunk in uploads[source].chunks():
                f.write(chunk)
        return dest
    if source.startswith("s3://"):
        parsed = urlparse(source)
        key = parsed.path.lstrip("/")
        # An empty, "." or ".." part could name one object two ways (a store that cleans paths reads "a/../b" as b).
        if "?" in source or "#" in source or not parsed.netloc or any(p in ("", ".", "..") for p in key.split("/")):
            raise DataError("is not an s3://bucket/key this can read as named (a key with ? or # would be read "
                            "cut short, and one with an empty, . or .. part is not taken)")
        if not sharing.may_import(user, parsed.netloc, key, bucket):
            raise DataError(sharing.PRODUCT_STORAGE)
        try:
            client = storage.s3_client()
            size = client.head_object(Bucket=parsed.netloc, Key=key)["ContentLength"]
            if size > settings.DATASET_MAX_BYTES:
                raise DataError(f"is {size:,} bytes, more than the {settings.DATASET_MAX_BYTES:,} a data file may be "
                                "(DATASET_MAX_BYTES)")
            client.download_file(parsed.netloc, key, str(dest))
        except botocore.exceptions.BotoCoreError as exc:
            raise DataError(f"cannot be read: {exc}") from None
        except botocore.exceptions.ClientError as exc:
            raise DataError(f"cannot be read: {exc.response.get('Error', {}).get('Message') or exc}") from None
        return dest
    if source.startswith(EXAMPLE_PREFIX):
        name = source[len(EXAMPLE_PREFIX):]
        examples = {p.name for p in EXAMPLES.glob("*.jsonl")}
        if name not in examples:
            raise DataError(f"no such example (there are {', '.join(sorted(examples))})")
        return EXAMPLES / name
    raise DataError(f"is neither a file uploaded with this launch nor a stored {kind} data set; a path on the "
                    "dashboard's machine is not read (a box is another machine): upload it, or name an "
                    "s3://bucket/key object")


def _kept(checked: Inspection, path: Path, name: str, kind: str, bucket: str, user, now) -> DataSet:
    """The checked file stored in the bucket and its row, new or the one already there, recorded under this name for
    this user (DataSetName, what _stored finds later). One row per content (docs/runs.md, "runs/datasets.py")."""
    dataset = DataSet.objects.filter(bucket=bucket, sha256=checked.sha256, kind=kind).first()
    if dataset is None:
        uri = _store(path, checked.sha256, bucket)
        try:
            with transaction.atomic():
                dataset = DataSet.objects.create(name=name, kind=kind, sha256=checked.sha256,
                                                 size_bytes=checked.size_bytes, rows=checked.rows, bucket=bucket,
                                                 uri=uri, report=_storable(checked.report), uploaded_by=user,
                                                 created_at=now)
        except IntegrityError:  # the same file stored by another launch a moment ago
            dataset = DataSet.objects.get(bucket=bucket, sha256=checked.sha256, kind=kind)
    DataSetName.objects.update_or_create(dataset=dataset, user=user, name=name, defaults={"stored_at": now})
    return dataset


def _storable(value):
    """The report with each NUL character shown as U+FFFD: PostgreSQL's jsonb holds no \u0000, and a sample record
    may contain one (the file itself is stored as it is)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_storable(v) for v in value]
    return value


def _store(path: Path, sha256: str, bucket: str) -> str:
    """Writes the file to <bucket>/datasets/<sha256>/data.jsonl; returns that folder's URI."""
    parsed = urlparse(bucket)
    if parsed.scheme == "s3":
        base = parsed.path.strip("/")
        prefix = f"{base + '/' if base else ''}datasets/{sha256}/"
        try:
            storage.s3_client().upload_file(str(path), parsed.netloc, prefix + DataSet.FILE_NAME)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise DataError(f"The data could not be stored in {bucket}: {exc}") from None
        return f"s3://{parsed.netloc}/{prefix}"
    folder = Path(parsed.path if parsed.scheme == "file" else bucket) / "datasets" / sha256
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{DataSet.FILE_NAME}.partial"
    shutil.copyfile(path, partial)
    partial.replace(folder / DataSet.FILE_NAME)  # whole or not at all
    return str(folder)


def box_grant(dataset: DataSet, expires_s: int) -> dict:
    """What a box needs to fetch one data set and check it: the file's size and sha256, and a read grant."""
    return {"dataset_id": dataset.pk, "name": dataset.name, "sha256": dataset.sha256,
            "manifest": {DataSet.FILE_NAME: {"size": dataset.size_bytes, "sha256": dataset.sha256}},
            "download": storage.read_grant(dataset.uri, [DataSet.FILE_NAME], expires_s)}
