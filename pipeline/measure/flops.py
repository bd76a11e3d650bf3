"""Parameter counts and training FLOPs of decoder-only transformers; MFU.

Pure functions: plain numbers in, plain numbers out. FLOPs are counted analytically because
the DeepSpeed flops profiler is about 1.9x too high at ZeRO-3 (docs/design.md).

Notation (PaLM, Chowdhery et al. 2022, appendix B): N non-embedding parameters, L layers,
H attention heads, Q head dimension (hidden / H), T sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass

ARCHS = ("llama", "gpt2")


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only transformer, enough to count its parameters and FLOPs.

    arch "llama": RMSNorm (weight only), SwiGLU MLP (gate, up, down), RoPE (no parameters),
    no biases, untied input embedding and lm_head (Llama-2, HF LlamaForCausalLM).
    arch "gpt2": LayerNorm (weight and bias), GELU MLP (fc, proj) with biases, fused qkv with
    bias, learned position embeddings, lm_head tied to the token embedding (GPT-2).
    """

    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    arch: str = "llama"

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; expected one of {ARCHS}")
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.arch == "gpt2" and self.n_kv_heads != self.n_heads:
            raise ValueError("gpt2 has no grouped-query attention: n_kv_heads must equal n_heads")

    @classmethod
    def of(cls, cfg: object) -> ModelShape:
        """From any object with these attribute names (e.g. pipeline.config.schema.ModelConfig)."""
        names = ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size", "seq_len", "arch")
        return cls(**{n: getattr(cfg, n) for n in names})

    @property
    def head_dim(self) -> int:
        """Q in PaLM's notation."""
        return self.hidden // self.n_heads


def _layer_params(s: ModelShape) -> int:
    h, f = s.hidden, s.ffn_hidden
    if s.arch == "llama":
        kv = s.n_kv_heads * s.head_dim
        attn = h * h + 2 * h * kv + h * h  # q, k, v, o; no biases
        mlp = 3 * h * f  # gate, up, down
        norms = 2 * h  # two RMSNorm weights
        return attn + mlp + norms
    attn = (h * 3 * h + 3 * h) + (h * h + h)  # fused qkv + bias, out proj + bias
    mlp = (h * f + f) + (f * h + h)  # fc + bias, proj + bias
    norms = 2 * (2 * h)  # ln_1, ln_2: weight and bias each
    return attn + mlp + norms


def _embedding_params(s: ModelShape) -> int:
    """Token embedding, position embedding (gpt2) and untied lm_head (llama)."""
    if s.arch == "llama":
        return 2 * s.vocab_size * s.hidden  # embed_tokens + lm_head
    return s.vocab_size * s.hidden + s.seq_len * s.hidden  # wte (tied to the head) + wpe


def param_count(shape: ModelShape) -> int:
    """Exact number of parameters of the PyTorch model (tied weights counted once).

    llama: V*h + L*(2*h*h + 2*h*kv_dim + 3*h*ffn + 2*h) + h + V*h
    (Llama-2-7B: 6,738,415,616, as HF LlamaForCausalLM reports).
    gpt2: V*h + T*h + L*(h*3h+3h + h*h+h + h*ffn+ffn + ffn*h+h + 4h) + 2h
    (GPT-2 small: 124,439,808, as HF GPT2LMHeadModel reports).
    """
    final_norm = shape.hidden if shape.arch == "llama" else 2 * shape.hidden
    return _embedding_params(shape) + shape.n_layers * _layer_params(shape) + final_norm


def non_embedding_params(shape: ModelShape) -> int:
    """N of the FLOPs formula: all parameters except token and position embeddings and an
    untied lm_head (Kaplan et al. 2020, section 2.1; PaLM appendix B).

    Norm weights are kept (Kaplan keeps them; they are negligible). Excluding the lm_head means
    its 6*V*h training FLOPs per token are not in model_flops_per_token although they are executed:
    1.7% on top of it for Llama-2-7B at T=4096, 37% for GPT-2 small at T=1024 (whose tied head
    is computed all the same). This follows docs/design.md's definition, so MFU is comparable with
    published figures, and it is conservative (MFU is never overstated).
    """
    return param_count(shape) - _embedding_params(shape)


def _attention_flops_per_token(shape: ModelShape) -> int:
    """Forward FLOPs per token of the score and value matmuls: QK^T and AV each cost
    2*T*H*Q per token per layer, so 4*L*H*Q*T (PaLM appendix B, full T without causal savings)."""
    return 4 * shape.n_layers * shape.n_heads * shape.head_dim * shape.seq_len


def model_flops_per_token(shape: ModelShape) -> int:
    """Training FLOPs per token, forward + backward: 6N + 12*L*H*Q*T (PaLM appendix B).

    6N: 2N forward multiply-adds of the weight matmuls, 4N backward (input and weight grads).
    12LHQT: 3x the attention forward term 4LHQT. Recompute is not counted (that is HFU's job).
    """
    return 6 * non_embedding_params(shape) + 3 * _attention_flops_per_token(shape)


def hardware_flops_per_token(shape: ModelShape, activation_checkpointing: bool) -> int:
    """FLOPs the hardware actually executes per token.

    Without recompute this equals model_flops_per_token. With full activation checkpointing each
    layer's forward runs again during backward: + 2N for the weight matmuls (8N in all, as in
    docs/design.md) + 4*L*H*Q*T for the attention forward, i.e. 8N + 16*L*H*Q*T
    (Korthikanti et al. 2022, section 5: hardware FLOPs include the recomputation).
    """
    flops = model_flops_per_token(shape)
    if activation_checkpointing:
        flops += 2 * non_embedding_params(shape) + _attention_flops_per_token(shape)
    return flops


def mfu(achieved_flops_per_s_per_device: float, peak_flops_per_s: float | None) -> float | None:
    """Achieved FLOP/s per device / peak dense FLOP/s of that device (PaLM appendix B).

    Returns None when the peak is unknown (None, zero, negative): never a guessed MFU. Pass
    model FLOP/s for MFU and hardware FLOP/s for HFU.
    """
    if peak_flops_per_s is None or not peak_flops_per_s > 0:
        return None
    return achieved_flops_per_s_per_device / peak_flops_per_s
