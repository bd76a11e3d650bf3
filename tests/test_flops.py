"""Parameter counts and FLOPs against published counts, real torch modules, and hand arithmetic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from pipeline.measure.flops import (
    ModelShape,
    hardware_flops_per_token,
    mfu,
    model_flops_per_token,
    non_embedding_params,
    param_count,
)

REPO = Path(__file__).resolve().parents[1]

GPT2_SMALL = ModelShape(
    n_layers=12,
    hidden=768,
    n_heads=12,
    n_kv_heads=12,
    ffn_hidden=3072,
    vocab_size=50257,
    seq_len=1024,
    arch="gpt2",
)
LLAMA2_7B = ModelShape(
    n_layers=32,
    hidden=4096,
    n_heads=32,
    n_kv_heads=32,
    ffn_hidden=11008,
    vocab_size=32000,
    seq_len=4096,
    arch="llama",
)
# Grouped-query attention: 8 KV heads of 128 (Llama-3-8B).
LLAMA3_8B = ModelShape(
    n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab_size=128256, seq_len=8192
)


def test_published_parameter_counts() -> None:
    # GPT-2 small, HF GPT2LMHeadModel: 124,439,808.
    # wte 50257*768 = 38,597,376; wpe 1024*768 = 786,432
    # per layer: ln_1 1,536 + qkv 768*2304+2304 = 1,771,776 + proj 768*768+768 = 590,592
    #   + ln_2 1,536 + fc 768*3072+3072 = 2,362,368 + proj 3072*768+768 = 2,360,064 = 7,087,872
    # 12 layers = 85,054,464; ln_f 1,536
    # total 38,597,376 + 786,432 + 85,054,464 + 1,536 = 124,439,808
    assert param_count(GPT2_SMALL) == 124_439_808
    # Llama-2-7B, HF LlamaForCausalLM: 6,738,415,616.
    # embed + lm_head 2*32000*4096 = 262,144,000
    # per layer: 4*4096^2 = 67,108,864 + 3*4096*11008 = 135,266,304 + 2*4096 = 202,383,360
    # 32 layers = 6,476,267,520; final norm 4,096
    # total 262,144,000 + 6,476,267,520 + 4,096 = 6,738,415,616
    assert param_count(LLAMA2_7B) == 6_738_415_616
    # Llama-3-8B, HF: 8,030,261,248.
    # embed + lm_head 2*128256*4096 = 1,050,673,152
    # per layer: q, o 2*4096^2 = 33,554,432 + k, v 2*4096*1024 = 8,388,608
    #   + 3*4096*14336 = 176,160,768 + 8,192 = 218,112,000; 32 layers = 6,979,584,000
    # total 1,050,673,152 + 6,979,584,000 + 4,096 = 8,030,261,248
    assert param_count(LLAMA3_8B) == 8_030_261_248
    # Llama-2-13B, HF: 13,015,864,320.
    # embed + lm_head 2*32000*5120 = 327,680,000
    # per layer 4*5120^2 = 104,857,600 + 3*5120*13824 = 212,336,640 + 10,240 = 317,204,480
    # 40 layers = 12,688,179,200; total 327,680,000 + 12,688,179,200 + 5,120 = 13,015,864,320
    llama2_13b = ModelShape(
        n_layers=40, hidden=5120, n_heads=40, n_kv_heads=40, ffn_hidden=13824, vocab_size=32000, seq_len=4096
    )
    assert param_count(llama2_13b) == 13_015_864_320
    # Llama-2-70B (GQA 64/8), HF: 68,976,648,192.
    # embed + lm_head 2*32000*8192 = 524,288,000
    # per layer q, o 2*8192^2 = 134,217,728 + k, v 2*8192*1024 = 16,777,216
    #   + 3*8192*28672 = 704,643,072 + 16,384 = 855,654,400; 80 layers = 68,452,352,000
    # total 524,288,000 + 68,452,352,000 + 8,192 = 68,976,648,192
    llama2_70b = ModelShape(
        n_layers=80, hidden=8192, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab_size=32000, seq_len=4096
    )
    assert param_count(llama2_70b) == 68_976_648_192


def test_non_embedding_params() -> None:
    # GPT-2: 124,439,808 - wte 38,597,376 - wpe 786,432 = 85,056,000 (Kaplan's "85M")
    assert non_embedding_params(GPT2_SMALL) == 85_056_000
    # Llama-2-7B: 6,738,415,616 - embed and lm_head 262,144,000 = 6,476,271,616
    assert non_embedding_params(LLAMA2_7B) == 6_476_271_616


class _TinyLlama(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        h, kv = s.hidden, s.n_kv_heads * s.head_dim
        self.embed = nn.Embedding(s.vocab_size, h)
        self.layers = nn.ModuleList()
        for _ in range(s.n_layers):
            layer = nn.ModuleDict(
                {
                    "q": nn.Linear(h, h, bias=False),
                    "k": nn.Linear(h, kv, bias=False),
                    "v": nn.Linear(h, kv, bias=False),
                    "o": nn.Linear(h, h, bias=False),
                    "gate": nn.Linear(h, s.ffn_hidden, bias=False),
                    "up": nn.Linear(h, s.ffn_hidden, bias=False),
                    "down": nn.Linear(s.ffn_hidden, h, bias=False),
                    "norm1": nn.RMSNorm(h),
                    "norm2": nn.RMSNorm(h),
                }
            )
            self.layers.append(layer)
        self.norm = nn.RMSNorm(h)
        self.lm_head = nn.Linear(h, s.vocab_size, bias=False)


class _TinyGPT2(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        h = s.hidden
        self.wte = nn.Embedding(s.vocab_size, h)
        self.wpe = nn.Embedding(s.seq_len, h)
        self.layers = nn.ModuleList()
        for _ in range(s.n_layers):
            layer = nn.ModuleDict(
                {
                    "ln_1": nn.LayerNorm(h),
                    "c_attn": nn.Linear(h, 3 * h),
                    "attn_proj": nn.Linear(h, h),
                    "ln_2": nn.LayerNorm(h),
                    "c_fc": nn.Linear(h, s.ffn_hidden),
                    "mlp_proj": nn.Linear(s.ffn_hidden, h),
                }
            )
            self.layers.append(layer)
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, s.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: parameters() yields it once


def _torch_count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_tiny_llama_matches_torch_module() -> None:
    s = ModelShape(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=172, vocab_size=101, seq_len=32)
    # kv_dim 2*16 = 32; per layer q 4096 + k 2048 + v 2048 + o 4096 + mlp 3*64*172 = 33,024
    # + norms 128 = 45,440; 2 layers 90,880; embed + head 2*101*64 = 12,928; final norm 64
    # total 90,880 + 12,928 + 64 = 103,872
    assert param_count(s) == 103_872
    assert _torch_count(_TinyLlama(s)) == 103_872


def test_tiny_gpt2_matches_torch_module() -> None:
    s = ModelShape(
        n_layers=2, hidden=32, n_heads=4, n_kv_heads=4, ffn_hidden=128, vocab_size=97, seq_len=16, arch="gpt2"
    )
    # per layer: ln_1 64 + qkv 32*96+96 = 3,168 + proj 32*32+32 = 1,056 + ln_2 64
    #   + fc 32*128+128 = 4,224 + proj 128*32+32 = 4,128 = 12,704; 2 layers 25,408
    # wte 97*32 = 3,104; wpe 16*32 = 512; ln_f 64
    # total 25,408 + 3,104 + 512 + 64 = 29,088
    assert param_count(s) == 29_088
    assert _torch_count(_TinyGPT2(s)) == 29_088


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_matches_the_project_model(arch: str) -> None:
    # The model the fine-tunes actually train (pipeline/train/model.py): transformers'
    # LlamaForCausalLM and GPT2LMHeadModel (fused c_attn with bias), built from the config.
    from pipeline.config.schema import ModelConfig
    from pipeline.train.model import build_model

    kv = 2 if arch == "llama" else 4
    cfg = ModelConfig(
        arch=arch, n_layers=3, hidden=48, n_heads=4, n_kv_heads=kv, ffn_hidden=100, vocab_size=77
    )
    assert param_count(ModelShape.of(cfg)) == _torch_count(build_model(cfg))


def test_model_flops_per_token() -> None:
    # Llama-2-7B: 6N = 6*6,476,271,616 = 38,857,629,696
    # 12LHQT = 12*32*32*128*4096 = 6,442,450,944; sum 45,300,080,640
    assert model_flops_per_token(LLAMA2_7B) == 45_300_080_640
    # GPT-2 small: 6*85,056,000 = 510,336,000; 12*12*12*64*1024 = 113,246,208; sum 623,582,208
    assert model_flops_per_token(GPT2_SMALL) == 623_582_208


def test_hardware_flops_per_token() -> None:
    # No recompute: hardware FLOPs are the model FLOPs.
    assert hardware_flops_per_token(LLAMA2_7B, activation_checkpointing=False) == 45_300_080_640
    # Recompute: 8N + 16LHQT = 8*6,476,271,616 + 16*32*32*128*4096
    #   = 51,810,172,928 + 8,589,934,592 = 60,400,107,520
    assert hardware_flops_per_token(LLAMA2_7B, activation_checkpointing=True) == 60_400_107_520


def test_mfu() -> None:
    # 400 TFLOP/s achieved on an H100 SXM (bf16 dense peak 989 TFLOP/s): 400/989 = 0.40445...
    assert mfu(400e12, 989e12) == pytest.approx(0.404448938)
    assert mfu(400e12, None) is None
    assert mfu(400e12, 0.0) is None
    assert mfu(400e12, -1.0) is None
    assert mfu(400e12, float("nan")) is None


def test_shape_validation() -> None:
    with pytest.raises(ValueError, match="arch"):
        ModelShape(
            n_layers=1, hidden=8, n_heads=2, n_kv_heads=2, ffn_hidden=8, vocab_size=8, seq_len=8, arch="bert"
        )
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelShape(n_layers=1, hidden=8, n_heads=4, n_kv_heads=3, ffn_hidden=8, vocab_size=8, seq_len=8)


def test_pure_modules_do_not_import_torch() -> None:
    # The login node composes and validates sweeps with these functions: keep them light.
    # (comm imports torch inside measure_collectives only.)
    code = "import sys, pipeline.measure.flops, pipeline.measure.memory, pipeline.measure.comm, pipeline.measure.cost; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
