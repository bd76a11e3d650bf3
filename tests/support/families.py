"""Small random-weight causal LMs of eight families with different layouts (test_describe,
test_families_sweep): their config.json, a save_pretrained folder, the model on the meta
device, and peft's "all-linear" targets as the pipeline passes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SMALL = {
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
# family -> its config.json: one per layout the issue names
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {"tie_word_embeddings": False},  # q/k/v biases
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 384},  # Conv1D
    "phi3": {"pad_token_id": 0},  # fused qkv_proj, gate_up_proj
    "gpt_neox": {"use_parallel_residual": True},  # fused query_key_value, parallel residual
    "qwen3": {"tie_word_embeddings": True, "head_dim": 24},  # tied embeddings, head size != hidden/heads
    "gemma": {"head_dim": 32},  # scaled embedding, tied, wide heads
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},  # routed experts
}
SEQ = 16


def hf_config(family: str) -> Any:
    from transformers import AutoConfig

    extra = FAMILIES[family]
    base = {} if family == "gpt2" else dict(SMALL)
    return AutoConfig.for_model(family, **{**base, **extra})


def save_family(folder: Path, family: str) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(hf_config(family)).save_pretrained(folder)
    return folder


def meta_model(family: str, experts: bool) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": "sdpa"}
    if experts:
        kwargs["experts_implementation"] = "batched_mm"
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config(family), **kwargs)


def all_linear(family: str) -> Any:
    """peft's "all-linear"; for a family with fused 3-D experts its names as a list, as the
    pipeline passes them (peft 0.21 maps "all-linear" on Mixtral to v4's expert names and adds
    adapters on the 3-D expert weights, which the pipeline does not train: docs/models.md)."""
    if family != "mixtral":
        return "all-linear"
    return ["q_proj", "k_proj", "v_proj", "o_proj"]
