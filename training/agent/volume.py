"""The run's volume on this box, where its base model is kept between boxes: its folder, and whether the model there
is the one the dashboard recorded. Other hosts wrote the volume: every file is checked against the dashboard's
manifest, and no link found there is followed (docs/runs.md, "Volumes")."""

import json
import os
import shutil
from pathlib import Path

from training import model_source
from training.checkpoint_names import UnsafePath, inside

from .manifests import file_digest

SIM_MOUNTS = "FLEET_SIM_MOUNTS"  # the simulated marketplace's boxes are processes: {mount path: the volume's folder}


class VolumeUnusable(Exception):
    """The volume is not mounted where the dashboard said."""


def mounted(mount_path: str) -> Path:
    """The folder the volume is mounted at; on the simulated marketplace, the folder that stands for it."""
    stand_ins = json.loads(os.environ.get(SIM_MOUNTS) or "{}")
    folder = Path(stand_ins.get(mount_path.rstrip("/"), mount_path))
    if not folder.is_dir():
        raise VolumeUnusable(f"the volume is not mounted at {mount_path}")
    return folder


def model_folder(root: Path, reference: str) -> Path:
    """The model's own folder in the volume; one that is a link (to anywhere) is removed, never followed."""
    folder = root / model_source.folder_name(reference)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()
    return folder


def mismatches(folder: Path, manifest: dict[str, dict]) -> list[str]:
    """What of the folder is not the manifest, in words (missing, another size or sha256, a link); empty when every
    file matches. A file that does not match is removed, so that the download replaces it, and so is the folder's
    completion marker, which no host's word makes true."""
    (folder / model_source.DONE).unlink(missing_ok=True)
    problems = []
    for name, entry in sorted(manifest.items()):
        unresolved = folder / name  # the manifest's names are the dashboard's; a link in the volume is the host's
        if unresolved.is_symlink() or (unresolved.exists() and not unresolved.is_file()):
            _remove(unresolved)
            problems.append(f"{name} is not a plain file")
            continue
        try:
            path = inside(folder, name)
        except UnsafePath as exc:  # a folder on its way is a link out of the volume: removed, then downloaded
            _unlink_first_link(folder, name)
            problems.append(str(exc))
            continue
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"{name} is {size:,} bytes, not {entry['size']:,}")
            if size > entry["size"]:
                path.unlink()
            continue
        if file_digest(path)[1] != entry["sha256"]:
            problems.append(f"{name} does not match its sha256")
            path.unlink()
    return problems


def keep_only(folder: Path, manifest: dict[str, dict]) -> list[str]:
    """Removes everything in the folder the manifest does not name (a hub model's small files, the hub client's own
    records of what it downloaded: another host may have written either), so those are downloaded afresh; the names
    of the manifest's files left there, each of which `mismatches` has checked."""
    names = set(manifest)
    for top, dirs, files in os.walk(folder, topdown=False):  # links are never followed
        here = Path(top)
        for name in files + [d for d in dirs if (here / d).is_symlink()]:
            if (here / name).relative_to(folder).as_posix() not in names:
                (here / name).unlink()
        for name in dirs:
            if not (here / name).is_symlink() and not any((here / name).iterdir()):
                (here / name).rmdir()
    return sorted(name for name in names if (folder / name).is_file() and not (folder / name).is_symlink()
                  and (folder / name).stat().st_size == manifest[name]["size"])


def _unlink_first_link(folder: Path, name: str) -> None:
    path = folder
    for part in Path(name).parts:
        path = path / part
        if path.is_symlink():
            path.unlink()
            return


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)
