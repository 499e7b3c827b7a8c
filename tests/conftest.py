"""Shared fixtures: a tiny model and a two-type catalog with round numbers, so that
hand calculations in the tests stay readable."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import espresso as es

# Hypothesis profiles: "ci" (the default) keeps the property tests bounded; "long" is the
# soak run of docs/development.md (pytest -m fuzz --hypothesis-profile long).
settings.register_profile("ci", max_examples=25, deadline=None, print_blob=True)
settings.register_profile("long", max_examples=2000, deadline=None, print_blob=True)
settings.load_profile("ci")

# The CLI's last net turns an unexpected exception into one line (exit 3); the tests want
# the exception itself, so a bug fails the test that met it (commands run as subprocesses
# inherit this too).
os.environ.setdefault("ESPRESSO_DEBUG", "1")


@pytest.fixture
def tiny_model() -> es.ModelSpec:
    # h=64, 4 heads of 16, 2 KV heads (kv dim 32), SwiGLU MLP of 128, vocabulary 100.
    return es.ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2,
                        ffn_hidden_size=128, vocab_size=100, gated_mlp=True,
                        tied_embeddings=False)


@pytest.fixture
def tiny_catalog() -> es.Catalog:
    # X: 1 GFLOP/s peak at 50% -> 5e8 FLOP/s; Y: 1e9 FLOP/s. Memory bandwidth so large that
    # memory-bound work takes no measurable time (the hand calculations count FLOPs).
    return es.Catalog(gpus=(
        es.GpuType(name="X", memory_gb=4, bf16_tflops=0.001, mem_bandwidth_gbs=1e6,
                   price_per_hour=2, count=8, gpus_per_node=8, intra_node_gbs=10,
                   inter_node_gbs=1, efficiency=0.5),
        es.GpuType(name="Y", memory_gb=4, bf16_tflops=0.002, mem_bandwidth_gbs=2e6,
                   price_per_hour=3, count=8, gpus_per_node=8, intra_node_gbs=10,
                   inter_node_gbs=0.5, efficiency=0.5),
    ))


@pytest.fixture
def exact_links() -> es.CostParams:
    """No latency, full link and memory bandwidth, the GPU's efficiency sustained, no
    overlap of the DP reduction: easier arithmetic."""
    return es.CostParams(link_latency_s=0.0, link_efficiency=1.0, memory_bandwidth_efficiency=1.0,
                         sustained_fraction=1.0, overlap_grad_reduce=False)


@pytest.fixture
def tiny_job(tiny_model: es.ModelSpec) -> es.Job:
    return es.Job(model=tiny_model, seq_len=8, global_batch_size=16, iterations=1000,
                  deadline_hours=1.0)
