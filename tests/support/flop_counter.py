"""torch's FlopCounterMode over one forward and backward of a transformers model, on the meta
device (nothing allocated, attention counted): the independent reference of every FLOPs figure."""

from __future__ import annotations

from typing import Any


def counted_flops_per_token(hf_config: Any, seq_len: int, checkpointing: bool = False) -> tuple[Any, float]:
    """The model transformers builds from `hf_config` (its own class: MistralForCausalLM for a
    MistralConfig) and FlopCounterMode's forward + backward FLOPs per token at `seq_len`."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM, DynamicCache

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa")
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        # an (empty) cache skips the packed-sequence check, which reads a meta tensor's value
        out = model(input_ids=ids, past_key_values=DynamicCache(config=hf_config), use_cache=False)
        out.logits.float().sum().backward()
    return model, counter.get_total_flops() / seq_len


def counted_flops_of_folder(folder: Any, seq_len: int) -> float:
    """FlopCounterMode's forward + backward FLOPs per token of the model in a saved folder, built
    by transformers from its config.json (its own class: its name starts with the model_type's
    letters), not by the pipeline."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    model, per_token = counted_flops_per_token(config, seq_len)
    assert type(model).__name__.lower().startswith(config.model_type.replace("_", "").lower()), type(model)
    return per_token
