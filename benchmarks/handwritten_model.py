"""The hand-written decoder this project trained before it built models with transformers, kept
only so benchmarks/bench_model.py can compare the transformers-built model's tokens/s with it at
the same shape. Not used by the pipeline.

- llama: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, no biases, untied
  embeddings; gpt2: LayerNorm, learned positions, GELU MLP with biases, tied embeddings.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.config.schema import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def rope_tables(seq_len: int, head_dim: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, heads, seq, head_dim); rotate pairs (even, odd) halves
    x1, x2 = x[..., ::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.arch == "gpt2"
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q = nn.Linear(cfg.hidden, cfg.n_heads * cfg.head_dim, bias=bias)
        self.k = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.v = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.o = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.hidden, bias=bias)
        self.rope = cfg.arch == "llama"

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if self.rope:
            q, k = apply_rope(q, cos[:t], sin[:t]), apply_rope(k, cos[:t], sin[:t])
        if self.n_kv != self.n_heads:  # grouped-query attention: share each kv head
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.swiglu = cfg.arch == "llama"
        bias = not self.swiglu
        self.up = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=bias)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=bias)
        self.gate = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False) if self.swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        norm = (lambda: RMSNorm(cfg.hidden)) if cfg.arch == "llama" else (lambda: nn.LayerNorm(cfg.hidden))
        self.norm1, self.attn, self.norm2, self.mlp = norm(), Attention(cfg), norm(), MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Causal LM; forward(tokens, targets) returns the mean cross-entropy loss."""

    def __init__(self, cfg: ModelConfig, activation_checkpointing: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden) if cfg.arch == "gpt2" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden) if cfg.arch == "llama" else nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        if cfg.arch == "gpt2":
            self.lm_head.weight = self.embed.weight  # tied, as in GPT-2
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith(("o.weight", "down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        cos, sin = self.rope_cos, self.rope_sin
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def build_model(cfg: ModelConfig, activation_checkpointing: bool = False, seed: int = 0) -> Transformer:
    """Random init from `seed`, identical on every rank and every attempt."""
    torch.manual_seed(seed)
    return Transformer(cfg, activation_checkpointing)
