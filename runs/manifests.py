"""A checkpoint's manifest: every file it holds, with its size and sha256, as the box that wrote it declared them.

Pure functions over plain values; how it guards a resume: docs/runs.md, "runs/manifests.py".
"""

import re

from training.checkpoint_names import MARKER

MAX_FILES = 1000
MAX_FILE_BYTES = 5 * 1024**4  # 5 TiB, S3's largest object
# Applied with fullmatch: `$` would also match before a trailing newline ("trainer.pt\n").
_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    pass


def validated(manifest) -> dict[str, dict]:
    """{name: {"size": int, "sha256": hex}} or ManifestError saying what is wrong; names are relative and plain."""
    if not isinstance(manifest, dict) or not manifest:
        raise ManifestError("a complete checkpoint needs its manifest: {file name: {size, sha256}}")
    if len(manifest) > MAX_FILES:
        raise ManifestError(f"a checkpoint holds at most {MAX_FILES} files")
    clean = {}
    for name, entry in manifest.items():
        shown = repr(name)[:80]
        if not isinstance(name, str) or len(name) > 300 or not _NAME.fullmatch(name) \
                or any(part in (".", "..") for part in name.split("/")):
            raise ManifestError(f"file {shown}: a name is a relative path of letters, digits, '.', '_', '-' and '/'")
        if name == MARKER or name.endswith("/" + MARKER):
            raise ManifestError(f"file {shown}: the completion marker is not part of the manifest")
        if not isinstance(entry, dict):
            raise ManifestError(f"file {shown}: expected {{size, sha256}}")
        size, digest = entry.get("size"), entry.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES:
            raise ManifestError(f"file {shown}: size must be a whole number of bytes")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ManifestError(f"file {shown}: sha256 must be 64 lowercase hex digits")
        clean[name] = {"size": size, "sha256": digest}
    return clean


def missing_from_store(manifest: dict[str, dict], stored: dict[str, int]) -> list[str]:
    """What the store lacks of a manifest (missing files, other sizes), in words; empty when it holds it all."""
    problems = []
    for name, entry in sorted(manifest.items()):
        if name not in stored:
            problems.append(f"{name} is not in the store")
        elif stored[name] != entry["size"]:
            problems.append(f"{name} is {stored[name]} bytes in the store, {entry['size']} in the manifest")
    return problems


def total_bytes(manifest: dict[str, dict]) -> int:
    return sum(entry["size"] for entry in manifest.values())
