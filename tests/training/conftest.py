"""CPU runs of the Triton kernels go through Triton's interpreter; it must be chosen before triton is imported."""

import os
import socket

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


@pytest.fixture
def make_routing():
    """Routing with uneven groups and some experts left empty: (top_k_index (T, K), top_k_weights (T, K))."""

    def make(num_tokens, num_experts, top_k, empty=(), dtype=torch.float32, generator=None):
        allowed = torch.tensor([e for e in range(num_experts) if e not in set(empty)])
        # Skewed preference so group sizes differ a lot.
        preference = torch.rand(num_tokens, len(allowed), generator=generator) + torch.linspace(0, 2, len(allowed))
        index = allowed[preference.topk(top_k, dim=-1).indices]
        weights = torch.softmax(torch.randn(num_tokens, top_k, generator=generator), dim=-1).to(dtype)
        return index, weights

    return make


@pytest.fixture
def tiny_config():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=6, num_experts_per_tok=2,
        max_position_embeddings=64,
    )


@pytest.fixture
def tiny_model(tiny_config):
    """A 2-layer Qwen3-MoE with random weights, in float32, the routed experts initialised like a checkpoint's."""
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(tiny_config).float()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.normal_(0, 0.1)
            layer.mlp.experts.down_proj.normal_(0, 0.1)
            layer.mlp.gate.weight.normal_(0, 0.1)
    return model


@pytest.fixture
def tokens():
    return torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def s3_server(monkeypatch):
    """A real S3-compatible server (moto) on loopback, with a bucket "runs"; its endpoint URL."""
    pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    import boto3

    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="runs")
    yield endpoint
    server.stop()
