"""The trainer asks for the allocator's growable segments unless the box's environment says otherwise."""

import os

from training.train import ALLOCATOR_DEFAULTS, allocator_defaults


def test_it_sets_expandable_segments_when_nothing_is_set(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    allocator_defaults()

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == ALLOCATOR_DEFAULTS == "expandable_segments:True"


def test_it_leaves_an_operators_setting_alone(monkeypatch):

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    allocator_defaults()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.8")
    allocator_defaults()
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
