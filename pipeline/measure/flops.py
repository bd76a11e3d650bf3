"""Parameter counts and training FLOPs of decoder-only transformers; MFU.

Pure functions: plain numbers in, plain numbers out. FLOPs are counted analytically because
the DeepSpeed flops profiler is about 1.9x too high at ZeRO-3 (docs/design.md).

Convention (torchtitan `get_num_flop_per_token`, nanoGPT `estimate_mfu`, PaLM appendix B):
every matmul with a weight is counted, the output layer (lm_head, tied or not: it is executed)
included; the input embedding lookup (and GPT-2's position lookup) is not a matmul and is not
counted. Notation: N matmul weights, L layers, H attention heads, Q head dimension
(hidden / H), T sequence length. Attention scores and values are counted over the full T x T
square (no causal halving), as torch's FlopCounterMode counts SDPA. Biases and norm weights
are not matmul weights (torchtitan counts norms in N: under 0.01% here). Checked in
tests/unit/test_flops.py against FlopCounterMode over forward + backward of the Hugging Face model
of every preset on the meta device: equal, to the FLOP.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.measure.kinds import ARCHS, METHODS


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only transformer, enough to count its parameters and FLOPs.

    arch "llama": RMSNorm (weight only), SwiGLU MLP (gate, up, down), RoPE (no parameters),
    no biases (HF LlamaForCausalLM).
    arch "gpt2": LayerNorm (weight and bias), GELU MLP (fc, proj) with biases, fused qkv with
    bias, learned position embeddings (HF GPT2LMHeadModel).
    tie_embeddings: the lm_head shares the token embedding's weight (GPT-2, Llama-3.2-1B);
    untied as in Llama-2. A tied head is one tensor, counted once, but still one matmul.
    """

    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    arch: str = "llama"
    tie_embeddings: bool = False

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
        return cls(
            **{n: getattr(cfg, n) for n in names}, tie_embeddings=bool(getattr(cfg, "tie_embeddings", False))
        )

    @property
    def head_dim(self) -> int:
        """Q in PaLM's notation."""
        return self.hidden // self.n_heads


def _layer_matmul_params(s: ModelShape) -> int:
    """Weights of one block's matmuls (no biases, no norms)."""
    h, f = s.hidden, s.ffn_hidden
    kv = s.n_kv_heads * s.head_dim
    mlp = (3 if s.arch == "llama" else 2) * h * f  # gate, up, down | fc, proj
    return 2 * h * h + 2 * h * kv + mlp  # q, o and k, v


def _layer_params(s: ModelShape) -> int:
    h, f = s.hidden, s.ffn_hidden
    if s.arch == "llama":
        return _layer_matmul_params(s) + 2 * h  # two RMSNorm weights
    biases = 3 * h + h + f + h  # qkv, attention out, fc, proj
    norms = 2 * (2 * h)  # ln_1, ln_2: weight and bias each
    return _layer_matmul_params(s) + biases + norms


def _embedding_params(s: ModelShape) -> int:
    """Token embedding, position embedding (gpt2) and an untied lm_head."""
    head = 0 if s.tie_embeddings else s.vocab_size * s.hidden
    pos = s.seq_len * s.hidden if s.arch == "gpt2" else 0
    return s.vocab_size * s.hidden + pos + head


def param_count(shape: ModelShape) -> int:
    """Exact number of parameters of the PyTorch model (tied weights counted once).

    llama: V*h + L*(2*h*h + 2*h*kv_dim + 3*h*ffn + 2*h) + h + (untied) V*h
    (Llama-2-7B untied: 6,738,415,616; Llama-3.2-1B tied: 1,235,814,400, as HF reports).
    gpt2: V*h + T*h + L*(h*3h+3h + h*h+h + h*ffn+ffn + ffn*h+h + 4h) + 2h + (untied) V*h
    (GPT-2 small tied: 124,439,808, as HF GPT2LMHeadModel reports).
    """
    final_norm = shape.hidden if shape.arch == "llama" else 2 * shape.hidden
    return _embedding_params(shape) + shape.n_layers * _layer_params(shape) + final_norm


def non_embedding_params(shape: ModelShape) -> int:
    """Kaplan et al. 2020's N (section 2.1): all parameters except token and position
    embeddings and an untied lm_head. A parameter count, not the FLOPs' N (see matmul_params)."""
    return param_count(shape) - _embedding_params(shape)


def matmul_params(shape: ModelShape) -> int:
    """N of the FLOPs formula: the weights of every matmul a token goes through, the output
    layer included (tied or not), the input embedding lookup not."""
    return shape.n_layers * _layer_matmul_params(shape) + shape.vocab_size * shape.hidden


def _attention_flops_per_token(shape: ModelShape) -> int:
    """Forward FLOPs per token of the score and value matmuls: QK^T and AV each cost
    2*T*H*Q per token per layer, so 4*L*H*Q*T (PaLM appendix B, full T without causal savings)."""
    return 4 * shape.n_layers * shape.n_heads * shape.head_dim * shape.seq_len


def model_flops_per_token(shape: ModelShape) -> int:
    """Training FLOPs per token, forward + backward: 6N + 12*L*H*Q*T, N = matmul_params.

    6N: 2N forward multiply-adds of the weight matmuls, 4N backward (input and weight grads).
    12LHQT: 3x the attention forward term 4LHQT. Recompute is not counted (that is HFU's job).
    """
    return 6 * matmul_params(shape) + 3 * _attention_flops_per_token(shape)


def training_flops_per_token(shape: ModelShape, trainable_params: int, method: str = "full") -> int:
    """Model FLOPs per trained token of a fine-tuning method.

    full: model_flops_per_token (6N + 12LHQT); `trainable_params` is not used.
    lora, qlora: the frozen model runs forward (2N + 4LHQT) and backward for the activation
    gradients only (2N + 8LHQT: attention has no weights, all of its backward is activation
    gradients), no weight gradients; the adapters cost 6 * trainable_params (forward, input and
    weight gradients) on top: 4N + 12LHQT + 6*N_adapter. QLoRA's dequantisation of the 4-bit
    weights is not a matmul and is not counted (as for LoRA; its executed FLOPs are the same).
    The input gradient of the first block is counted although a frozen embedding does not need
    it (2*h*h*... of one block: under 1/L of the 2N term).
    """
    if method not in METHODS:
        raise ValueError(f"unknown fine-tuning method {method!r}; expected one of {METHODS}")
    if trainable_params < 0:
        raise ValueError(f"trainable_params must be >= 0, got {trainable_params}")
    if method == "full":
        return model_flops_per_token(shape)
    return 4 * matmul_params(shape) + 3 * _attention_flops_per_token(shape) + 6 * trainable_params


def recompute_flops_per_token(shape: ModelShape) -> int:
    """FLOPs that full activation checkpointing (one checkpoint per block, non-reentrant, as
    Hugging Face's gradient checkpointing and pipeline/train/model.py do) executes again in
    backward: each block's forward, 2*N_block + 4LHQT per layer, except what no saved tensor
    needs. torch's non-reentrant checkpoint stops recomputing once backward has every tensor it
    saved: in llama the down projection's output only feeds the residual add, so that matmul
    (2*h*ffn per layer) is not run again; in GPT-2 the dropout after the MLP projection keeps
    its output needed, so the whole block is recomputed. Checked against FlopCounterMode."""
    per_layer = 2 * _layer_matmul_params(shape)
    if shape.arch == "llama":
        per_layer -= 2 * shape.hidden * shape.ffn_hidden
    return shape.n_layers * per_layer + _attention_flops_per_token(shape)


def hardware_flops_per_token(shape: ModelShape, activation_checkpointing: bool) -> int:
    """FLOPs the hardware executes per token (Korthikanti et al. 2022, section 5: hardware
    FLOPs include the recomputation): model_flops_per_token, plus recompute_flops_per_token
    with activation checkpointing on."""
    flops = model_flops_per_token(shape)
    if activation_checkpointing:
        flops += recompute_flops_per_token(shape)
    return flops


def mfu(achieved_flops_per_s_per_device: float, peak_flops_per_s: float | None) -> float | None:
    """Achieved FLOP/s per device / peak dense FLOP/s of that device (PaLM appendix B).

    Returns None when the peak is unknown (None, zero, negative): never a guessed MFU. Pass
    model FLOP/s for MFU and hardware FLOP/s for HFU.
    """
    if peak_flops_per_s is None or not peak_flops_per_s > 0:
        return None
    return achieved_flops_per_s_per_device / peak_flops_per_s
