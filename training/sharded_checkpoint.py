"""Checkpoints of a run on several ranks: every rank's shard written with torch.distributed.checkpoint, one adapter
(docs/training.md, "training/sharded_checkpoint.py")."""

import io
import pickle
import shutil
from pathlib import Path

import torch
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.tensor import DTensor, Shard

from training import checkpoint

SHARDED = "sharded"


class UnsafeCheckpoint(ValueError):
    """A sharded checkpoint holds what its reader will not build: refused before anything of it is used."""


# What DCP pickles into .metadata for a state of tensors (torch 2.11 to 2.13): its own records, torch.Size, dtypes,
# layouts and the checkpoint's path. Nothing else is built.
_METADATA_RECORDS = {"Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorStorageMetadata", "TensorProperties",
                     "StorageMeta", "_MEM_FORMAT_ENCODING"}
_PATHS = {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        allowed = ((module == dcp_metadata.__name__ and name in _METADATA_RECORDS)
                   or (module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo")
                   or (module == "torch.serialization" and name == "_get_layout")
                   or (module in ("pathlib", "pathlib._local") and name in _PATHS)
                   or (module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype))))
        if not allowed:
            raise UnsafeCheckpoint(f"the checkpoint's sharded metadata holds {module}.{name}, which it may not")
        return super().find_class(module, name)


def read_metadata(data: bytes):
    """DCP's Metadata from the bytes of a .metadata file, built from DCP's own records only."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpoint:
        raise
    except Exception as exc:  # noqa: BLE001 - a truncated or garbled file: refused like a forged one
        raise UnsafeCheckpoint(f"the checkpoint's sharded metadata cannot be read: {type(exc).__name__}") from None
    if not isinstance(metadata, dcp_metadata.Metadata) or not isinstance(metadata.storage_data, dict):
        raise UnsafeCheckpoint("the checkpoint's sharded metadata is not DCP's Metadata")
    for entry in metadata.state_dict_metadata.values():
        if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            raise UnsafeCheckpoint("the checkpoint's sharded state holds an entry that is not a tensor")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name or "\\" in name:
            raise UnsafeCheckpoint(f"the checkpoint's sharded metadata names a shard file {name!r} outside its folder")
    return metadata


def checked_folder(folder: Path) -> Path:
    """The folder, once its .metadata reads as DCP's records of tensors in shard files of its own (else
    UnsafeCheckpoint, raised as it is rather than inside DCP's CheckpointException)."""
    read_metadata((Path(folder) / ".metadata").read_bytes())
    return Path(folder)


class SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read by `read_metadata` (no code from the file runs)."""

    def read_metadata(self, *args, **kwargs):
        locate = getattr(self, "_get_metadata_path", None)  # torch >= 2.6 may name a metadata file per rank
        path = locate(kwargs.get("rank")) if locate else self.fs.concat_path(self.path, ".metadata")
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_metadata(stream.read())
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = getattr(self, "load_id", None)
        return metadata


class TensorsOnly(DefaultLoadPlanner):
    """DCP's load planner, refusing bytes entries (which its own load_bytes would unpickle with weights_only off)."""

    def load_bytes(self, read_item, value):
        raise UnsafeCheckpoint(f"the checkpoint's sharded state holds bytes for {read_item.dest_index.fqn}")


class _GatheredAdapter:
    """What `Uploader.save` calls `save_pretrained` on: the PeftModel, with the whole adapter gathered from the
    ranks as its state dict (peft writes its config and tensors from them)."""

    def __init__(self, model, state_dict):
        self.model, self.state_dict = model, state_dict

    def save_pretrained(self, path):
        self.model.save_pretrained(path, state_dict=self.state_dict)


def trainable(model):
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def _shardable(ranks, param, tensor):
    """A tensor as DCP should store it: FSDP's DTensor as it is; an expert slice as row `rank` of (ranks, ...)."""
    if isinstance(tensor, DTensor) or id(param) not in ranks.slices.local_ids():
        return tensor
    return DTensor.from_local(tensor.unsqueeze(0), ranks.mesh, [Shard(0)], run_check=False)


def _sharded_state(ranks, model, optimizer_state):
    """{"model": name -> factor, "optimizer": name -> {step, exp_avg, exp_avg_sq}}, views of the live tensors."""
    params = trainable(model)
    state = {"model": {name: _shardable(ranks, p, p.detach()) for name, p in params}, "optimizer": {}}
    for index, (name, p) in enumerate(params):
        entry = optimizer_state.get(index)
        if entry:
            state["optimizer"][name] = {key: _shardable(ranks, p, value) if torch.is_tensor(value) and value.dim()
                                        else value for key, value in entry.items()}
    return state


class ShardedUploader:
    """`checkpoint.Uploader`'s save and wait, on every rank; rank 0 uploads."""

    def __init__(self, ranks, model, store, staging, keep, protected=frozenset()):
        self.ranks, self.model = ranks, model
        self.shards_root = Path(f"{staging}-shards")
        self.uploader = checkpoint.Uploader(store, staging, keep, protected=protected) if ranks.main else None
        ranks.barrier()  # rank 0 has cleared the staging folder before any rank writes

    def save(self, model, trainer_state, name, exports=()):
        ranks = self.ranks
        adapter = {n: ranks.full_value(n, p) for n, p in trainable(model)}
        optimizer = trainer_state["optimizer"]
        shards = self.shards_root / name
        if ranks.main:
            shutil.rmtree(shards, ignore_errors=True)
        ranks.barrier()
        dcp.save(_sharded_state(ranks, model, optimizer["state"]), checkpoint_id=shards)
        torch.save(checkpoint.rng_state(), shards / f"rng-{ranks.rank}.pt")
        ranks.barrier()  # every rank's shard is written
        if not ranks.main:
            return
        common = {**trainer_state, "optimizer": {"param_groups": optimizer["param_groups"]}}
        common.pop("rng")

        def move_shards(local):
            (local / SHARDED).mkdir()
            for path in shards.iterdir():
                shutil.move(path, local / (path.name if path.name.startswith("rng-") else Path(SHARDED) / path.name))
            shards.rmdir()

        self.uploader.save(_GatheredAdapter(model, adapter), common, name, exports=(move_shards, *exports))

    def wait(self):
        if self.uploader is not None:
            self.uploader.wait()


def resume(ranks, model, store, staging):
    """(name, trainer state) of the newest complete checkpoint, loaded into `model` on every rank (the optimizer's
    state in `state["optimizer"]`, as `checkpoint.load` gives it), or (None, None)."""
    name = ranks.gather(checkpoint.latest_complete(store) if ranks.main else None)[0]
    if name is None:
        return None, None
    local = Path(staging) / "resume"
    if ranks.main:
        checkpoint.load(store, name, local)  # downloads it, refusing a folder that lost its marker
    ranks.barrier()
    state = torch.load(local / "trainer.pt", weights_only=True)
    params = trainable(model)
    optimizer_state = {index: {"step": torch.zeros((), dtype=torch.float32),
                               "exp_avg": torch.zeros_like(p.detach()), "exp_avg_sq": torch.zeros_like(p.detach())}
                       for index, (_, p) in enumerate(params)}
    target = _sharded_state(ranks, model, optimizer_state)
    with torch.no_grad():
        dcp.load(target, storage_reader=SafeReader(checked_folder(local / SHARDED)), planner=TensorsOnly())
    state["optimizer"] = {"state": optimizer_state, "param_groups": state["optimizer"]["param_groups"]}
    state["rng"] = torch.load(local / f"rng-{ranks.rank}.pt", weights_only=True)
    ranks.barrier()  # every rank has read the folder
    return name, state
