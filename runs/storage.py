"""Where a run's checkpoints live, and the scoped, short-lived access a rented box gets to them.

A box never holds the account's storage key: for an S3-compatible bucket it gets a presigned POST whose policy only
admits keys under the run's own prefix, and presigned GETs for the files of the checkpoint it resumes from, all
expiring (the dashboard renews them with each heartbeat). For a local folder (the embedded default, where the
simulated box is a process on this machine) it gets the folder's path.
"""

import functools
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings


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
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError("An S3 bucket looks like s3://bucket/prefix.")
        if not settings.S3_ACCESS_KEY:
            raise ValueError("S3 buckets need S3_ACCESS_KEY and S3_SECRET_KEY in the dashboard's environment.")
        return bucket_uri
    if parsed.scheme not in ("", "file"):
        raise ValueError(f"Unsupported bucket scheme {parsed.scheme!r}: use s3://bucket/prefix or a local folder.")
    if not Path(parsed.path if parsed.scheme else bucket_uri).is_absolute():
        raise ValueError("A local checkpoint folder must be an absolute path.")
    return bucket_uri


def _client():
    return _s3_client(settings.S3_ENDPOINT_URL or None, settings.S3_REGION or None, settings.S3_ACCESS_KEY,
                      settings.S3_SECRET_KEY)


@functools.lru_cache(maxsize=4)
def _s3_client(endpoint_url, region, access_key, secret_key):
    """One client per set of settings: every heartbeat signs a grant, and making a boto3 client costs far more."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key)


def upload_grant(where: Location, expires_s: int) -> dict:
    if where.kind == "local":
        return {"kind": "local", "path": str(Path(where.bucket) / where.prefix)}
    post = _client().generate_presigned_post(
        Bucket=where.bucket, Key=where.prefix + "${filename}",
        Conditions=[["starts-with", "$key", where.prefix]], ExpiresIn=expires_s)
    return {"kind": "s3-post", "url": post["url"], "fields": post["fields"], "prefix": where.prefix}


def download_grant(where: Location, checkpoint_uri: str, expires_s: int) -> dict:
    """Everything under one checkpoint, readable for a while: presigned GETs, or the local folder."""
    if where.kind == "local":
        return {"kind": "local", "path": str(Path(where.bucket) / where.prefix / checkpoint_uri)}
    client = _client()
    prefix = where.prefix + checkpoint_uri.rstrip("/") + "/"
    files = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            files[item["Key"][len(prefix):]] = client.generate_presigned_url(
                "get_object", Params={"Bucket": where.bucket, "Key": item["Key"]}, ExpiresIn=expires_s)
    return {"kind": "s3-get", "files": files}
