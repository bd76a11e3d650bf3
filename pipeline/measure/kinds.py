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
