"""The enumerated values the measurements and the config share, declared once: the precisions,
fine-tuning methods, model architectures and families. The schema checks config values against
these, and the memory, FLOP and description functions refuse anything else; everyone imports
them from here (pipeline.measure imports nothing of the project, so every layer can).
`tests/unit/test_enumerations.py` fails when one of these values is spelled again as a list of literals."""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["fp32", "bf16", "fp16"]
"""The dtype of weights and matmuls (bf16/fp16 keep fp32 master weights)."""
PRECISIONS: tuple[str, ...] = get_args(Precision)

Method = Literal["full", "lora", "qlora"]
"""Every weight trained, LoRA adapters on a frozen base, or adapters on a 4-bit base."""
METHODS: tuple[str, ...] = get_args(Method)

Arch = Literal["llama", "gpt2"]
"""The architectures with an exact analytic shape (parameters, FLOPs, activations)."""
ARCHS: tuple[str, ...] = get_args(Arch)

Family = Literal["llama", "gpt2", "mistral", "qwen2"]
"""transformers model_types of the presets (the analytic architectures and two more)."""
FAMILIES: tuple[str, ...] = get_args(Family)

# chat data (pipeline/data: formats, masks, padding or packing; the report's padding vs packing)
ChatFormat = Literal["auto", "messages", "sharegpt", "alpaca", "prompt_completion"]
"""data.format: the jsonl record's form (auto: each record by its fields)."""
CHAT_FORMATS: tuple[str, ...] = get_args(ChatFormat)

TrainOn = Literal["assistant", "all", "last"]
"""data.train_on: the tokens of a chat sample the loss is taken on."""
TRAIN_ON: tuple[str, ...] = get_args(TrainOn)

Packing = Literal["pad", "pack"]
"""data.packing: pad to the longest of a micro-batch, or pack into bins of model.seq_len."""
PACKINGS: tuple[str, ...] = get_args(Packing)

Overlong = Literal["truncate", "drop", "refuse"]
"""data.overlong: what happens to a chat sample longer than model.seq_len + 1 tokens."""
OVERLONG: tuple[str, ...] = get_args(Overlong)
