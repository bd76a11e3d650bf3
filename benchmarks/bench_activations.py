"""The fit's activation term per family against what the real model saves for backward (issue
#23), and against Korthikanti et al. 2022's 34sbh per layer (no score term), which the memory
model used before:

  measured: saved-tensor hooks on CPU, the distinct storages autograd holds after one forward
            (pipeline.train.describe.measure_saved_bytes), parameters excluded
  fit:      the memory model's activation term from the model's description (measured once on
            the meta device when the description is made)

Small random models of each family (the shapes of tests/unit/test_describe.py, or --hidden wider),
fp32 and bf16, at two sequence lengths and micro-batches. Run:
.venv/bin/python -m benchmarks.bench_activations [--hidden 256]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from pipeline.measure.describe import ModelDescription
from pipeline.measure.memory import GIB, MemoryQuery, activation_bytes_per_device, breakdown
from pipeline.train.describe import describe_hf, measure_saved_bytes
from pipeline.train.model import _DROPOUTS

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "gpt2": {},
    "phi3": {"pad_token_id": 0},
    "gpt_neox": {},
    "qwen3": {"tie_word_embeddings": True},
    "gemma": {},
}


def hf_config(family: str, hidden: int) -> Any:
    from transformers import AutoConfig

    if family == "gpt2":
        hf = AutoConfig.for_model("gpt2", n_embd=hidden, n_layer=2, n_head=4, n_positions=256, vocab_size=384)
    else:
        hf = AutoConfig.for_model(
            family,
            vocab_size=384,
            hidden_size=hidden,
            intermediate_size=hidden * 3 // 2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **FAMILIES[family],
        )
    for key in _DROPOUTS:
        if isinstance(getattr(hf, key, None), float):
            setattr(hf, key, 0.0)
    return hf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    print(
        f"{'family':<9} {'dtype':<5} {'b x s':>7} {'measured':>10} {'fit':>10} {'fit/meas':>8} {'34sbh/meas':>10}"
    )
    for family in FAMILIES:
        hf = hf_config(family, args.hidden)
        d = ModelDescription.from_json(describe_hf(hf))
        for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa", dtype=dtype).train()
            for b, s in ((1, 64), (4, 128)):
                measured = measure_saved_bytes(model, b, s, d.vocab_size)
                q = MemoryQuery.from_description(
                    d, s, micro_batch=b, zero_stage=2, dp_ranks=1, capacity_bytes=GIB, precision=precision
                )
                fit = next(t.device_bytes for t in breakdown(q) if t.name == "activations")
                w = 4 if precision == "fp32" else 2
                formula = activation_bytes_per_device(s, b, d.hidden, d.n_heads, d.n_layers, w)
                print(
                    f"{family:<9} {precision:<5} {f'{b}x{s}':>7} {measured:>10} {fit:>10} "
                    f"{fit / measured:>8.3f} {formula / measured:>10.3f}"
                )


if __name__ == "__main__":
    main()
