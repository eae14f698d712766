"""A rented box's host has root: whatever it wrote into a checkpoint store is read as data, never run, and never
written outside the folder it belongs in."""

import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from training import checkpoint
from training.agent.resume import restore
from training.checkpoint_names import UnsafePath, inside

NAME = "ckpt-p00-s00000002"


class _RunsCode:
    """What a hostile pickle looks like: unpickling it calls a function of the attacker's choosing."""

    def __init__(self, proof):
        self.proof = proof

    def __reduce__(self):
        return (os.mkdir, (self.proof,))


def _checkpoint(folder, trainer_state_bytes: bytes):
    (folder / "adapter").mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(folder / "adapter" / "adapter_model.safetensors"))
    (folder / "trainer.pt").write_bytes(trainer_state_bytes)
    (folder / checkpoint.MARKER).write_text("1\n")


def test_it_loads_the_trainer_state_it_wrote(tmp_path):
    store = checkpoint.LocalStore(tmp_path / "store")
    _checkpoint(tmp_path / "store" / NAME, b"")
    state = {"optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": [{"lr": 1e-4}]},
             "rng": checkpoint.rng_state(), "data_position": 7, "phase_name": "sft", "reference": torch.arange(4.0)}
    torch.save(state, tmp_path / "store" / NAME / "trainer.pt")
    _, loaded = checkpoint.load(store, NAME, tmp_path / "local")
    assert loaded["data_position"] == 7 and torch.equal(loaded["reference"], torch.arange(4.0))
    checkpoint.set_rng_state(loaded["rng"])


def test_it_refuses_a_trainer_state_whose_pickle_would_run_code(tmp_path):
    proof = tmp_path / "the-pickle-ran"
    store = checkpoint.LocalStore(tmp_path / "store")
    _checkpoint(tmp_path / "store" / NAME, b"")
    torch.save({"optimizer": _RunsCode(str(proof))}, tmp_path / "store" / NAME / "trainer.pt")
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load(store, NAME, tmp_path / "local")
    assert not proof.exists()


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../outside", "adapter/../../outside", "a//b", "./a",
                                  "C:evil", "\\\\host\\share", "a\x00b"])
def test_it_refuses_a_file_name_that_leaves_its_folder(tmp_path, name):
    with pytest.raises(UnsafePath):
        inside(tmp_path, name)


def test_it_refuses_a_name_that_leaves_through_a_link(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafePath):
        inside(tmp_path / "root", "link/outside")
    assert inside(tmp_path / "root", "adapter/adapter_model.safetensors") == (
        tmp_path / "root" / "adapter" / "adapter_model.safetensors").resolve()


def test_it_downloads_no_key_that_leaves_the_checkpoint(tmp_path, s3_server):
    store = checkpoint.S3Store("s3://runs/team/run-9", endpoint_url=s3_server, region="us-east-1")
    store.client.put_object(Bucket="runs", Key=f"team/run-9/{NAME}/trainer.pt", Body=b"state")
    store.client.put_object(Bucket="runs", Key=f"team/run-9/{NAME}/../../../escaped", Body=b"evil")
    with pytest.raises(UnsafePath):
        store.download(NAME, tmp_path / "local" / NAME)
    assert not any(p.name == "escaped" for p in tmp_path.rglob("*"))


class _Recorder:
    def __init__(self):
        self.posts = []

    def call(self, method, path, body=None):
        self.posts.append((path, body))
        return {}


def test_the_agent_restores_no_file_outside_the_store(tmp_path):
    entry = {"size": 1, "sha256": "0" * 64}
    escaping_file = {"phase": 0, "step": 2, "uri": NAME, "manifest": {"../../escaped": entry},
                     "download": {"kind": "s3-get", "files": {"../../escaped": "http://127.0.0.1:9/never-fetched"}}}
    escaping_folder = {"phase": 0, "step": 1, "uri": "s3://runs/team/..", "manifest": {"a": entry},
                       "download": {"kind": "s3-get", "files": {}}}
    api = _Recorder()
    assert restore(api, [escaping_file, escaping_folder], tmp_path / "store") is None
    assert not (tmp_path / "escaped").exists() and not any((tmp_path / "store").glob("*"))
    assert [(path, body["step"]) for path, body in api.posts] == [("checkpoints/rejected", 2),
                                                                   ("checkpoints/rejected", 1)]


# -- the sharded (several-GPU) layout: DCP's folder ----------------------------------------------------------------

def _sharded(folder, state):
    import warnings

    from torch.distributed import checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP says it runs without a process group here, as one rank
        dcp.save(state, checkpoint_id=folder)
    return folder / ".metadata"


def _load_sharded(folder, target):
    from torch.distributed import checkpoint as dcp

    from training.sharded_checkpoint import SafeReader, TensorsOnly, checked_folder

    dcp.load(target, storage_reader=SafeReader(checked_folder(folder)), planner=TensorsOnly())
    return target


def _tensors():
    return {"model": {"a": torch.randn(3, 4), "b": torch.arange(6, dtype=torch.bfloat16)},
            "optimizer": {"a": {"step": torch.tensor(5.0), "exp_avg": torch.randn(3, 4)}}}


def test_it_resumes_the_sharded_state_it_wrote(tmp_path):
    written = _tensors()
    _sharded(tmp_path, written)
    loaded = _load_sharded(tmp_path, {"model": {"a": torch.zeros(3, 4), "b": torch.zeros(6, dtype=torch.bfloat16)},
                                      "optimizer": {"a": {"step": torch.tensor(0.0), "exp_avg": torch.zeros(3, 4)}}})
    assert torch.equal(loaded["model"]["a"], written["model"]["a"]) and torch.equal(loaded["model"]["b"],
                                                                                      written["model"]["b"])
    assert loaded["optimizer"]["a"]["step"] == 5 and torch.equal(loaded["optimizer"]["a"]["exp_avg"],
                                                                 written["optimizer"]["a"]["exp_avg"])


def test_it_refuses_sharded_metadata_whose_pickle_would_run_code(tmp_path):
    from training.sharded_checkpoint import UnsafeCheckpoint

    metadata = _sharded(tmp_path, _tensors())
    metadata.write_bytes(pickle.dumps(_RunsCode(str(tmp_path / "pwned"))))
    with pytest.raises(UnsafeCheckpoint, match="holds posix.mkdir|holds os.mkdir|holds nt.mkdir"):
        _load_sharded(tmp_path, _tensors())
    # The reader DCP is given refuses it too, without the check before it.
    from torch.distributed import checkpoint as dcp

    from training.sharded_checkpoint import SafeReader, TensorsOnly

    # DCP raises its own kind (a BaseException); torch 2.13 carries the reader's words in it, 2.11 says only that
    # the metadata is None. Either way nothing of the file ran.
    with pytest.raises(BaseException, match="sharded metadata holds (posix|os|nt).mkdir|metadata is None"):
        dcp.load(_tensors(), storage_reader=SafeReader(tmp_path), planner=TensorsOnly())
    assert not (tmp_path / "pwned").exists()


def test_it_refuses_sharded_metadata_that_points_outside_its_folder(tmp_path):
    from training.sharded_checkpoint import UnsafeCheckpoint, read_metadata

    metadata_file = _sharded(tmp_path / "ckpt", _tensors())
    (tmp_path / "secret.distcp").write_bytes((tmp_path / "ckpt" / "__0_0.distcp").read_bytes())
    metadata = read_metadata(metadata_file.read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = "../secret.distcp"
    metadata_file.write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpoint, match="shard file '../secret.distcp' outside its folder"):
        _load_sharded(tmp_path / "ckpt", _tensors())


def test_it_refuses_a_sharded_state_holding_bytes(tmp_path):
    # DCP's own planner would unpickle a bytes entry with weights_only off: a forged one must not get that far.
    from training.sharded_checkpoint import UnsafeCheckpoint

    _sharded(tmp_path, {"model": {"a": torch.zeros(2)}, "extra": {"note": "not a tensor"}})
    with pytest.raises(UnsafeCheckpoint, match="BytesStorageMetadata"):
        _load_sharded(tmp_path, {"model": {"a": torch.zeros(2)}, "extra": {"note": ""}})
