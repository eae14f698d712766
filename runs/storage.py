"""Where a run's checkpoints live, and the scoped, short-lived access a rented box gets to them: expiring presigned
URLs under the run's own prefix, never the account's key (docs/runs.md, "runs/storage.py").
"""

import functools
import hashlib
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings

from training import model_source
from training.checkpoint_names import MARKER

MAX_POST_BYTES = 5 * 1024**3  # the most one S3 POST upload may carry
# Objects listed under one checkpoint before it is refused: a manifest names at most runs.manifests.MAX_FILES, and
# a box's retried uploads may leave a few more. Under a model's prefix: a hub snapshot holds hundreds at most.
MAX_CHECKPOINT_OBJECTS = 2000
MAX_MODEL_OBJECTS = 20000
ATTEMPTS = "attempts"  # runs/<run>/attempts/<attempt>/: what each box uploads; never a checkpoint's name
_RUN_PREFIX = re.compile(r"(^|/)runs/\d+(/|$)")


# What the dashboard writes under a run's bucket: each run's checkpoints and the stored data sets.
PRODUCT_FOLDERS = ("runs/", "datasets/")


def product_areas(bucket_uris) -> set[tuple[str, str]]:
    """(bucket, key prefix) of each folder the product writes under these s3:// bucket URIs; other URIs add none."""
    areas = set()
    for uri in bucket_uris:
        parsed = urlparse(uri)
        if parsed.scheme == "s3" and parsed.netloc:
            base = parsed.path.strip("/")
            areas |= {(parsed.netloc.lower(), f"{base + '/' if base else ''}{folder}") for folder in PRODUCT_FOLDERS}
    return areas


def in_areas(bucket: str, key: str, areas: set[tuple[str, str]]) -> bool:
    """Whether the object `key`, or anything under `key` when it ends in "/" (a prefix to list), lies in an area."""
    return any(bucket.lower() == where and (key.startswith(prefix) or (key.endswith("/") and prefix.startswith(key)))
               for where, prefix in areas)


@dataclass(frozen=True)
class Location:
    kind: str  # "s3" or "local"
    bucket: str  # the S3 bucket, or the local folder
    prefix: str  # the run's own prefix, ending in "/"


def location(bucket_uri: str, run_id: int) -> Location:
    parsed = urlparse(bucket_uri)
    if parsed.scheme == "s3":
        base = parsed.path.strip("/")
        return Location("s3", parsed.netloc, f"{base + '/' if base else ''}runs/{run_id}/")
    path = Path(parsed.path if parsed.scheme == "file" else bucket_uri).expanduser()
    return Location("local", str(path), f"runs/{run_id}/")


def validate_bucket(bucket_uri: str) -> str:
    """A clear error for a bucket the product cannot use; the URI unchanged otherwise."""
    parsed = urlparse(bucket_uri)
    if _RUN_PREFIX.search(parsed.path if parsed.scheme in ("s3", "file") else bucket_uri):
        # Each run's files live under <bucket>/runs/<id>/: a bucket inside one would hand this run's boxes a grant
        # into another run's checkpoints (or theirs into this one's).
        raise ValueError("The bucket must not lie inside another run's folder (a 'runs/<number>' part).")
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError("An S3 bucket looks like s3://bucket/prefix.")
        if not settings.S3_ACCESS_KEY:
            raise ValueError("S3 buckets need S3_ACCESS_KEY and S3_SECRET_KEY in the dashboard's environment.")
        return bucket_uri
    if parsed.scheme not in ("", "file"):
        raise ValueError(f"Unsupported bucket scheme {parsed.scheme!r}: use s3://bucket/prefix or a local folder.")
    if not settings.LOCAL_BUCKETS:
        raise ValueError("A folder on the dashboard's machine cannot be a run's bucket here: a rented box cannot "
                         "write its checkpoints there (only the simulated marketplace's boxes, which run on this "
                         "machine, can: LOCAL_BUCKETS). Name an s3://bucket/prefix.")
    folder = Path(parsed.path if parsed.scheme else bucket_uri)
    if not folder.is_absolute():
        raise ValueError("A local checkpoint folder must be an absolute path.")
    data_dir = Path(settings.DATA_DIR).resolve()
    if not folder.resolve().is_relative_to(data_dir):  # the dashboard creates it: never wherever it may write
        raise ValueError(f"A local checkpoint folder must lie under the dashboard's DATA_DIR ({data_dir}).")
    try:  # a folder no upload can reach would lose every checkpoint and the adapter
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ValueError(f"The checkpoint folder {folder} cannot be written: {exc.strerror or exc}.") from None
    return bucket_uri


def s3_client():
    """The account's S3 client, for the dashboard's own reads and writes (a box never gets it)."""
    return _s3_client(settings.S3_ENDPOINT_URL or None, settings.S3_REGION or None, settings.S3_ACCESS_KEY,
                      settings.S3_SECRET_KEY)


@functools.lru_cache(maxsize=4)
def _s3_client(endpoint_url, region, access_key, secret_key):
    """One client per set of settings: every heartbeat signs a grant, and making a boto3 client costs far more."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, config=Config(signature_version="s3v4"))


class TooManyObjects(ValueError):
    """More objects under a checkpoint's prefix than any checkpoint holds: a box's upload grant covers its attempt's
    whole folder, so it could put millions there, and listing them all would hold a request (and its memory)."""


def _listed(bucket: str, prefix: str):
    """The objects under a prefix, a page (at most 1,000) at a time: [(name relative to the prefix, size, ETag)]."""
    for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        yield [(item["Key"][len(prefix):], item["Size"], item.get("ETag", "")) for item in page.get("Contents", [])]


def _pages(bucket: str, prefix: str):
    """The objects under a prefix, a page (at most 1,000) at a time: [(name relative to the prefix, size)]."""
    for page in _listed(bucket, prefix):
        yield [(name, size) for name, size, _ in page]


def _etagged(bucket: str, prefix: str, *, at_most: int) -> dict[str, tuple[int, str]]:
    """{name relative to the prefix: (size, ETag)} of every object under it; TooManyObjects past `at_most`."""
    found = {}
    for page in _listed(bucket, prefix):
        found.update({name: (size, etag) for name, size, etag in page})
        if len(found) > at_most:
            raise TooManyObjects(f"the store holds more than {at_most} objects under {prefix}")
    return found


def _objects(bucket: str, prefix: str, *, at_most: int) -> dict[str, int]:
    """{name relative to the prefix: size} of every object under it; TooManyObjects past `at_most`."""
    return {name: size for name, (size, _) in _etagged(bucket, prefix, at_most=at_most).items()}


def _presigned_gets(bucket: str, prefix: str, names, expires_s: int) -> dict:
    """An s3-get grant: a presigned GET of exactly each named key under the prefix, and of nothing else."""
    client = s3_client()
    return {"kind": "s3-get", "files": {
        name: client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": prefix + name},
                                            ExpiresIn=expires_s) for name in sorted(names)}}


def attempt_prefix(where: Location, attempt_id: int) -> str:
    """The one folder an attempt's box may write: runs/<run>/attempts/<attempt>/. Nothing another attempt reads
    lives there (docs/runs.md, "runs/storage.py")."""
    return f"{where.prefix}{ATTEMPTS}/{attempt_id}/"


def _folder(where: Location, checkpoint_uri: str, attempt_id: int | None) -> str:
    """A checkpoint's folder relative to the bucket: its sealed one, or its upload by an attempt."""
    base = where.prefix if attempt_id is None else attempt_prefix(where, attempt_id)
    return base + checkpoint_uri.strip("/") + "/"


def upload_grant(where: Location, attempt_id: int, expires_s: int) -> dict:
    """Writing under the attempt's own folder, and nowhere else, for a while: a presigned POST whose policy admits
    only that prefix, or the local folder."""
    prefix = attempt_prefix(where, attempt_id)
    if where.kind == "local":
        return {"kind": "local", "path": str(Path(where.bucket) / prefix)}
    post = s3_client().generate_presigned_post(
        Bucket=where.bucket, Key=prefix + "${filename}",
        Conditions=[["starts-with", "$key", prefix], ["content-length-range", 0, MAX_POST_BYTES]],
        ExpiresIn=expires_s)
    return {"kind": "s3-post", "url": post["url"], "fields": post["fields"], "prefix": prefix}


def download_grant(where: Location, checkpoint_uri: str, names, expires_s: int) -> dict:
    """The named files of one sealed checkpoint (its manifest's), readable for a while: presigned GETs, or the local
    folder. Nothing else under the checkpoint is offered, and no box can write there."""
    if where.kind == "local":
        return {"kind": "local", "path": str(Path(where.bucket) / _folder(where, checkpoint_uri, None))}
    return _presigned_gets(where.bucket, _folder(where, checkpoint_uri, None), names, expires_s)


def written_files(where: Location, checkpoint_uri: str, attempt_id: int | None) -> dict[str, tuple[int, str]]:
    """{relative name: (size, ETag)} of what an attempt uploaded of one checkpoint (or, for None, of its sealed
    copy), its completion marker left out; a local file's ETag is "" (its seal checks the sha256 instead)."""
    folder = _folder(where, checkpoint_uri, attempt_id)
    if where.kind == "local":
        root = Path(where.bucket) / folder
        if not root.is_dir():
            return {}
        return {p.relative_to(root).as_posix(): (p.stat().st_size, "") for p in root.rglob("*")
                if p.is_file() and not p.is_symlink() and p.name != MARKER}
    listed = _etagged(where.bucket, folder, at_most=MAX_CHECKPOINT_OBJECTS)
    return {name: found for name, found in listed.items() if name.rsplit("/", 1)[-1] != MARKER}


def stored_files(where: Location, checkpoint_uri: str, attempt_id: int | None = None) -> dict[str, int]:
    """{relative name: size} of a sealed checkpoint (or of an attempt's upload of it), its marker left out."""
    return {name: size for name, (size, _) in written_files(where, checkpoint_uri, attempt_id).items()}


class SealFailed(Exception):
    """An attempt's upload could not be copied to its sealed folder as recorded: a file changed or went missing
    after the checkpoint was declared complete."""


def seal(where: Location, checkpoint_uri: str, attempt_id: int, manifest: dict[str, dict],
         etags: dict[str, str]) -> None:
    """Copies exactly the manifest's files of an attempt's upload into the checkpoint's sealed folder, emptied first,
    its marker last. On S3 each copy is server-side and only of the object listed when the completion was checked
    (its ETag); locally each copy is checked against the manifest's sha256. SealFailed otherwise."""
    delete_checkpoint(where, checkpoint_uri)
    source, target = _folder(where, checkpoint_uri, attempt_id), _folder(where, checkpoint_uri, None)
    if where.kind == "local":
        _seal_local(Path(where.bucket), source, target, manifest)
        return
    import botocore.exceptions

    client = s3_client()
    for name in sorted(manifest):
        try:
            client.copy_object(Bucket=where.bucket, Key=target + name, CopySourceIfMatch=etags[name],
                               CopySource={"Bucket": where.bucket, "Key": source + name})
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412"):
                raise SealFailed(f"{name} changed in the store after the checkpoint was declared complete") from None
            if code in ("NoSuchKey", "404"):
                raise SealFailed(f"{name} is no longer in the store") from None
            raise
    client.put_object(Bucket=where.bucket, Key=target + MARKER, Body=b"sealed\n")


def _seal_local(bucket: Path, source: str, target: str, manifest: dict[str, dict]) -> None:
    root = (bucket / source).resolve()
    for name, entry in sorted(manifest.items()):
        original, copied = bucket / source / name, bucket / target / name
        if original.is_symlink() or not original.resolve().is_relative_to(root):  # a box's link out of its folder
            raise SealFailed(f"{name} is not a file of the upload")
        copied.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(original, copied)
        except FileNotFoundError:
            raise SealFailed(f"{name} is no longer in the store") from None
        if copied.stat().st_size != entry["size"] or _sha256(copied) != entry["sha256"]:
            raise SealFailed(f"{name} changed in the store after the checkpoint was declared complete")
    (bucket / target / MARKER).write_text("sealed\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def delete_checkpoint(where: Location, checkpoint_uri: str, attempt_id: int | None = None) -> None:
    """Removes one sealed checkpoint's files (or an attempt's upload of it), its completion marker first so that a
    half-deleted one is never complete."""
    folder = _folder(where, checkpoint_uri, attempt_id)
    if where.kind == "local":
        root = Path(where.bucket) / folder
        (root / MARKER).unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
        return
    s3_client().delete_object(Bucket=where.bucket, Key=folder + MARKER)
    _delete_under(where.bucket, folder)


def delete_attempt(where: Location, attempt_id: int) -> None:
    """Removes everything an attempt's box uploaded (what it left once its grants ran out)."""
    if where.kind == "local":
        shutil.rmtree(Path(where.bucket) / attempt_prefix(where, attempt_id), ignore_errors=True)
        return
    _delete_under(where.bucket, attempt_prefix(where, attempt_id))


def _delete_under(bucket: str, prefix: str) -> None:
    client = s3_client()
    for page in _pages(bucket, prefix):  # a page deleted as it is read: however many a box put there
        if page:
            client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": prefix + name} for name, _ in page]})


def read_grant(folder_uri: str, names, expires_s: int) -> dict:
    """Reading the named files of one stored folder (a data set's), for a while: presigned GETs of exactly those
    keys under s3://bucket/prefix/, or the local folder. Nothing else in the bucket is offered."""
    parsed = urlparse(folder_uri)
    if parsed.scheme != "s3":
        return {"kind": "local", "path": folder_uri}
    return _presigned_gets(parsed.netloc, parsed.path.strip("/") + "/", names, expires_s)


class ModelUnreadable(ValueError):
    """An s3:// model the dashboard cannot list with its own key, or one with no files."""


class StoreUnavailable(Exception):
    """The store did not answer a listing (no connection, a timeout, a 5xx or a slow-down): nothing is wrong with
    what was asked, so it is asked again later rather than refused."""


_PASSING = ("SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable", "InternalError")


def model_read_grant(model_uri: str, expires_s: int) -> dict:
    """Reading every file of an s3://bucket/prefix model, for a while: each object under the prefix by its size
    (what the box checks each download against) and a presigned GET of exactly that key. Nothing outside the
    prefix is offered. ModelUnreadable when the dashboard's key cannot list it or it holds nothing."""
    bucket, prefix = model_source.s3_parts(model_uri)
    sizes = model_files(model_uri)
    return {"kind": "s3", "uri": model_uri, "files": sizes, "download": _presigned_gets(bucket, prefix, sizes,
                                                                                        expires_s)}


def model_files(model_uri: str) -> dict[str, int]:
    """{name relative to the prefix: size} of every file of an s3:// model, listed with the dashboard's key and
    signed for no one; ModelUnreadable as model_read_grant says."""
    import botocore.exceptions

    bucket, prefix = model_source.s3_parts(model_uri)
    try:
        sizes = {name: size for name, size in _objects(bucket, prefix, at_most=MAX_MODEL_OBJECTS).items()
                 if not name.endswith("/")}
    except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as exc:
        raise StoreUnavailable(f"the store did not answer listing {model_uri}: {exc}") from None
    except botocore.exceptions.ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") in _PASSING or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500:
            raise StoreUnavailable(f"the store did not answer listing {model_uri}: {error.get('Code', '')}") from None
        raise ModelUnreadable(f"{model_uri} cannot be listed with the dashboard's key: "
                              f"{error.get('Code', '')} {error.get('Message') or exc}".strip()) from None
    except TooManyObjects:
        raise ModelUnreadable(f"{model_uri} holds more than {MAX_MODEL_OBJECTS:,} objects, more than any model's "
                              "folder: name the folder of the model's own files") from None
    except botocore.exceptions.BotoCoreError as exc:
        raise ModelUnreadable(f"{model_uri} cannot be listed: {exc}") from None
    if not sizes:
        raise ModelUnreadable(f"{model_uri} holds no files")
    return dict(sorted(sizes.items()))
