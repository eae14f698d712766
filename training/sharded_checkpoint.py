"""Checkpoints of a run on several ranks: every rank's shard written with torch.distributed.checkpoint, one adapter.

The checkpoint folder is the one-process layout (training/checkpoint.py) plus
    sharded/            the LoRA factors and the optimizer's state, each rank's part (DCP: one file a rank and
                        .metadata); FSDP's shards as they are, each rank's slice of the experts as row `rank` of a
                        (ranks, ...) tensor, so it resumes on a box with the same rank count
    rng-<rank>.pt       each rank's random state
adapter/ is the whole adapter gathered on rank 0, one peft adapter (`PeftModel.from_pretrained` reads it, the vLLM
export is made from it); trainer.pt (rank 0) holds the rest of the trainer's state, the optimizer's parameter
groups without their tensors.

Every rank writes its shard into a staging folder of the box; after a barrier (every shard written) rank 0 moves
them into the snapshot and hands it to the one uploader, which writes the completion marker last, once.
"""

import shutil
from pathlib import Path

import torch
from torch.distributed import checkpoint as dcp
from torch.distributed.tensor import DTensor, Shard

from training import checkpoint

SHARDED = "sharded"


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
        dcp.load(target, checkpoint_id=local / SHARDED)
    state["optimizer"] = {"state": optimizer_state, "param_groups": state["optimizer"]["param_groups"]}
    state["rng"] = torch.load(local / f"rng-{ranks.rank}.pt", weights_only=True)
    ranks.barrier()  # every rank has read the folder
    return name, state
