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
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
AUDITED: dict[str, dict[str, Any]] = {
    "olmo2": {},
    "granite": {"embedding_multiplier": 2.0, "logits_scaling": 4.0},
    "falcon": {"new_decoder_architecture": True, "num_kv_heads": 2, "alibi": False},
    "gemma2": {"head_dim": 16, "sliding_window": 8},
    "qwen2_moe": {**_MOE, "num_experts": 4, "shared_expert_intermediate_size": 48, "decoder_sparse_step": 1},
    "deepseek_v3": {
        **_MOE,
        "n_routed_experts": 4,
        "num_key_value_heads": 4,  # MLA: one key and value per head
        "first_k_dense_replace": 1,
        "n_shared_experts": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": 24,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "n_group": 1,
        "topk_group": 1,
    },
    "phimoe": {"num_local_experts": 4, "num_experts_per_tok": 2},  # a router that is an nn.Linear
    # peft remaps these (transformers' qwen2_moe conversion pattern): the dense layer's MLP names
    "qwen3_moe": {**_MOE, "num_experts": 4, "head_dim": 16, "mlp_only_layers": [0]},
    "glm4_moe": {
        **_MOE,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "head_dim": 16,
        "n_group": 1,
        "topk_group": 1,
    },
}
"""Families an audit used (issue #46), each with a layout of its own; the MoE ones include
families whose LoRA targets peft 0.21 rewrites onto the routed experts' 3-D weights."""


def hf_config(family: str) -> Any:
    from transformers import AutoConfig

    extra = FAMILIES[family] if family in FAMILIES else AUDITED[family]
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

    from pipeline.train.model import with_attention  # sdpa, else the family's own (gemma2)

    kwargs = {"experts_implementation": "batched_mm"} if experts else {}
    with torch.device("meta"):
        return with_attention(AutoModelForCausalLM.from_config, hf_config(family), **kwargs)


def all_linear(family: str) -> list[str]:
    """The LoRA targets the job gives peft for "all-linear" (pipeline/train/model.py all_linear:
    every linear layer but the output head and the MoE routers, as a list); peft 0.21 may still
    rewrite them on an MoE family (test_describe checks the adapters it builds)."""
    from pipeline.train.model import all_linear as job_all_linear

    return job_all_linear(meta_model(family, False))
