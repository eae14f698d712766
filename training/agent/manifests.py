"""Files checked against a manifest ({name: {size, sha256}}): a folder's manifest, and fetching one whose every file
must match it. Names come from a store a rented box can write, so each is kept inside its folder."""

import hashlib
import shutil
from pathlib import Path

import httpx

from training.checkpoint_names import MARKER, inside


class CheckpointMismatch(Exception):
    """Files that are not what their manifest says: missing, another size or sha256, or more bytes than listed."""


def fetch_verified(candidate: dict, target: Path) -> None:
    """Puts the files of `candidate`'s manifest into `target` from its grant (a local folder or presigned URLs),
    each checked for its size and sha256."""
    manifest, grant = candidate["manifest"], candidate["download"]
    shutil.rmtree(target, ignore_errors=True)
    for name, entry in sorted(manifest.items()):
        dest = inside(target, name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if grant["kind"] == "local":
            source = inside(grant["path"], name)
            if source.is_symlink() or not source.is_file():
                raise CheckpointMismatch(f"{name} is missing from the store")
            shutil.copyfile(source, dest)
        else:
            url = grant["files"].get(name)
            if not url:
                raise CheckpointMismatch(f"no download was granted for {name}")
            download(url, dest, limit=entry["size"])
        size, digest = file_digest(dest)
        if size != entry["size"] or digest != entry["sha256"]:
            raise CheckpointMismatch(f"{name} does not match its manifest ({size} bytes, sha256 {digest[:12]}...)")


def download(url: str, dest: Path, *, limit: int) -> None:
    """Streams one file; more bytes than the manifest says is a mismatch, found without filling the disk."""
    written = 0
    with httpx.Client(timeout=120) as http, http.stream("GET", url) as response:
        response.raise_for_status()
        with open(dest, "wb") as f:
            for chunk in response.iter_bytes():
                written += len(chunk)
                if written > limit:
                    raise CheckpointMismatch(f"{dest.name} is larger than its manifest says")
                f.write(chunk)


def file_digest(path: Path) -> tuple[int, str]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


def manifest_of(folder: Path) -> dict[str, dict]:
    """{name: {size, sha256}} of a checkpoint folder, its marker left out: what the dashboard records."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)
    manifest = {}
    for path in files:
        size, digest = file_digest(path)
        manifest[path.relative_to(folder).as_posix()] = {"size": size, "sha256": digest}
    return manifest
