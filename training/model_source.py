"""Where a run's base model comes from (a folder, a hub id, an s3:// prefix), and its weights brought onto the box's
disk once (docs/training.md, "training/model_source.py")."""

from __future__ import annotations

import glob
import json
import logging
import re
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlparse

import httpx

from training.checkpoint_names import UnsafePath, inside

log = logging.getLogger("training.model_source")

DONE = ".fleet-model-complete"  # written last into a finished folder: what it holds and where it came from
_HUB_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", re.ASCII)  # huggingface_hub's REPO_ID_REGEX
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # S3's bucket naming rules, as far as a name shows them


class ModelRefused(Exception):
    """The model could not be brought onto this box; the message says which file and why."""


def kind_of(path: str) -> str:
    """"s3", "hub" or "folder" for a model.path (a folder is whatever is neither of the others)."""
    if path.startswith("s3://"):
        return "s3"
    return "hub" if hub_id_problem(path) is None else "folder"


def hub_id_problem(text: str) -> str | None:
    """Why `text` is no hub id, in words; None when it has a hub id's shape (whether it exists is the hub's say)."""
    if not text or len(text) > 96 * 2 + 1:
        return "a hub id is owner/name"
    if text.count("/") > 1:
        return "a hub id is owner/name, with one '/'"
    if not _HUB_ID.fullmatch(text) or any(len(part) > 96 for part in text.split("/")):
        return ("a hub id's owner and name are 1 to 96 letters, digits, '-', '_' or '.', and neither starts or ends "
                "with '-' or '.'")
    if "--" in text or ".." in text:
        return "a hub id has no '--' or '..'"
    if text.endswith(".git"):
        return "a hub id does not end in '.git'"
    return None


def s3_problem(uri: str) -> str | None:
    """Why `uri` is no s3://bucket/prefix of a model, in words; None when it has that shape."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not _BUCKET.fullmatch(parsed.netloc or ""):
        return "an S3 model is s3://bucket/prefix, the bucket 3 to 63 lower-case letters, digits, '.' or '-'"
    if not parsed.path.strip("/"):
        return "an S3 model is a folder inside the bucket (s3://bucket/prefix), not the whole bucket"
    if parsed.query or parsed.fragment or "//" in parsed.path.strip("/"):
        return "an S3 model's prefix is a plain folder name (no '?', '#' or empty parts)"
    return None


def s3_parts(uri: str) -> tuple[str, str]:
    """(bucket, prefix ending in "/") of an s3://bucket/prefix that passed s3_problem."""
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.strip("/") + "/"


def folder_name(reference: str) -> str:
    """The box's folder for one model reference: readable, one per reference, no path tricks."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", reference).strip("._") or "model"


def fetch(grant: dict, root: Path, *, token: str | None = None, snapshot=None, tries: int = 3,
          sleep=time.sleep, trust_marker: bool = True, skip: Iterable[str] = ()) -> Path:
    """The model's folder on this box, downloaded into `root` unless a finished copy is there already. `grant` is
    the spec's model (hub, s3 or refused; docs/agent.md). `token` (HF_TOKEN) goes to the hub, never written anywhere.
    `trust_marker` False (a volume other hosts wrote): no marker is proof. `skip`: a hub model's files checked in
    the folder already, not downloaded again."""
    if grant["kind"] == "refused":
        raise ModelRefused(f"the dashboard could not grant the model: {grant['reason']}")
    reference = grant["repo_id"] if grant["kind"] == "hub" else grant["uri"]
    folder = Path(root) / folder_name(reference)
    if trust_marker and _finished(folder, reference):
        log.info("model %s: the box has it already in %s", reference, folder)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if grant["kind"] == "hub":
        fetch_hub(grant["repo_id"], folder, revision=grant.get("revision"), token=token, snapshot=snapshot,
                  tries=tries, sleep=sleep, skip=skip)
    elif grant["kind"] == "s3":
        fetch_s3(grant["files"], grant["download"]["files"], folder, tries=tries, sleep=sleep)
    else:
        raise ModelRefused(f"the model's grant is of an unknown kind {grant['kind']!r}")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts)
    (folder / DONE).write_text(json.dumps({"reference": reference, "bytes": size,
                                           "seconds": round(time.monotonic() - started, 1)}))
    return folder


def _finished(folder: Path, reference: str) -> bool:
    try:
        return json.loads((folder / DONE).read_text()).get("reference") == reference
    except (OSError, ValueError, AttributeError):
        return False


def fetch_hub(repo_id: str, folder: Path, *, revision: str | None = None, token: str | None = None, snapshot=None,
              tries: int = 3, sleep=time.sleep, skip: Iterable[str] = ()) -> None:
    """The hub repository's files into `folder` (huggingface_hub's snapshot_download with a local folder: its
    partial files there are resumed, on the next try and on the next start alike), but for the files named in `skip`
    (checked there already). An error is tried again, then refused with the hub's words, the token struck out."""
    if snapshot is None:
        from huggingface_hub import snapshot_download as snapshot
    skipped = {"ignore_patterns": [glob.escape(name) for name in sorted(skip)]} if skip else {}
    for attempt in range(tries):
        try:
            snapshot(repo_id, revision=revision, local_dir=str(folder), token=token or None, **skipped)
            return
        except Exception as exc:  # noqa: BLE001 - the hub fails in many ways (auth, gated, network); each is said
            said = f"{type(exc).__name__}: {exc}"
            if token:
                said = said.replace(token, "[HF_TOKEN]")
            if attempt == tries - 1 or _permanent(exc):
                raise ModelRefused(f"the model {repo_id} could not be downloaded from the hub: {said[:1500]}") from None
            log.warning("model %s: try %d failed (%s); trying again", repo_id, attempt + 1, said[:300])
            sleep(5.0 * (attempt + 1))


def _permanent(exc: Exception) -> bool:
    """A refusal no retry will change: no such repository or revision, gated, or a token that opens nothing."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"RepositoryNotFoundError", "RevisionNotFoundError", "GatedRepoError",
                         "EntryNotFoundError", "HFValidationError"})


def fetch_s3(sizes: dict[str, int], urls: dict[str, str], folder: Path, *, tries: int = 3, sleep=time.sleep) -> None:
    """Each listed file into `folder` through its presigned GET, continued from a partial file's size, and checked
    to be the size the dashboard listed. A file too large or of another size is refused at once; a broken transfer
    is tried again (from where it broke), then refused."""
    for name, size in sorted(sizes.items()):
        try:
            dest = inside(folder, name)
        except UnsafePath as exc:
            raise ModelRefused(f"the model lists an unusable file name: {exc}") from None
        if dest.is_file() and dest.stat().st_size == size:
            continue
        if name not in urls:
            raise ModelRefused(f"no download was granted for the model's file {name}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")
        for attempt in range(tries):
            try:
                _ranged_get(urls[name], partial, size)
                break
            except (httpx.HTTPError, OSError) as exc:
                if attempt == tries - 1:
                    raise ModelRefused(f"the model's file {name} could not be downloaded: "
                                       f"{type(exc).__name__}: {without_query(str(exc))}") from None
                log.warning("model file %s: try %d failed (%s); continuing", name, attempt + 1, type(exc).__name__)
                sleep(2.0 * (attempt + 1))
        partial.replace(dest)


def _ranged_get(url: str, partial: Path, size: int) -> None:
    have = partial.stat().st_size if partial.is_file() else 0
    if have > size:
        partial.unlink()
        have = 0
    if have == size:
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    with httpx.Client(timeout=120) as http, http.stream("GET", url, headers=headers) as response:
        response.raise_for_status()
        if response.status_code != 206:  # the whole file after all: start it again
            have = 0
        with open(partial, "ab" if have else "wb") as f:
            for chunk in response.iter_bytes(1 << 20):
                have += len(chunk)
                if have > size:
                    raise ModelRefused(f"the model's file {partial.name[:-len('.partial')]} is larger than the "
                                       f"{size:,} bytes listed")
                f.write(chunk)
    if have != size:
        raise ModelRefused(f"the model's file {partial.name[:-len('.partial')]} is {have:,} bytes, not the "
                           f"{size:,} listed")


def without_query(text: str) -> str:
    """An error's words without a presigned URL's signature (it opens the file until it expires), cut to 1,500
    characters: what may be reported to the dashboard (its pages, its alerts) or logged."""
    return re.sub(r"\?[^\s'\"]*", "?...", text)[:1500]
