"""Parameter counts and FLOPs against published counts, real torch modules, and hand arithmetic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from pipeline.measure.flops import (
    ModelShape,
    hardware_flops_per_token,
    mfu,
    model_flops_per_token,
    non_embedding_params,
    param_count,
    training_flops_per_token,
)
from tests.support.flop_counter import counted_flops_per_token

REPO = Path(__file__).resolve().parents[2]

GPT2_SMALL = ModelShape(
    n_layers=12,
    hidden=768,
    n_heads=12,
    n_kv_heads=12,
    ffn_hidden=3072,
    vocab_size=50257,
    seq_len=1024,
    arch="gpt2",
    tie_embeddings=True,
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
    # Llama-3.2-1B (GQA 32/8, tied embeddings), HF: 1,235,814,400.
    # embed 128256*2048 = 262,668,288 (the lm_head is the same tensor)
    # per layer q, o 2*2048^2 = 8,388,608 + k, v 2*2048*512 = 2,097,152
    #   + 3*2048*8192 = 50,331,648 + 4,096 = 60,821,504; 16 layers = 973,144,064
    # total 262,668,288 + 973,144,064 + 2,048 = 1,235,814,400 (untied it would be 1,498,482,688)
    llama32_1b = ModelShape(
        n_layers=16,
        hidden=2048,
        n_heads=32,
        n_kv_heads=8,
        ffn_hidden=8192,
        vocab_size=128256,
        seq_len=4096,
        tie_embeddings=True,
    )
    assert param_count(llama32_1b) == 1_235_814_400
    assert param_count(ModelShape.of(_preset("llama-1b"))) == 1_235_814_400


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
        n_layers=2,
        hidden=32,
        n_heads=4,
        n_kv_heads=4,
        ffn_hidden=128,
        vocab_size=97,
        seq_len=16,
        arch="gpt2",
        tie_embeddings=True,
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
        arch=arch,
        n_layers=3,
        hidden=48,
        n_heads=4,
        n_kv_heads=kv,
        ffn_hidden=100,
        vocab_size=77,
        tie_embeddings=arch == "gpt2",
    )
    assert param_count(ModelShape.of(cfg)) == _torch_count(build_model(cfg))


def test_model_flops_per_token() -> None:
    # Llama-2-7B: N = 32 layers * 202,375,168 matmul weights + lm_head 131,072,000 = 6,607,077,376
    # 6N = 39,642,464,256; 12LHQT = 12*32*32*128*4096 = 6,442,450,944; sum 46,084,915,200
    assert model_flops_per_token(LLAMA2_7B) == 46_084_915_200
    # GPT-2 small: N = 12 * 7,077,888 + tied head 38,597,376 = 123,532,032; 6N = 741,192,192
    # 12*12*12*64*1024 = 113,246,208; sum 854,438,400
    assert model_flops_per_token(GPT2_SMALL) == 854_438_400


def test_hardware_flops_per_token() -> None:
    # No recompute: hardware FLOPs are the model FLOPs.
    assert hardware_flops_per_token(LLAMA2_7B, activation_checkpointing=False) == 46_084_915_200
    # Recompute of each block but its down projection: 32 * 2*(202,375,168 - 4096*11008)
    #   = 32 * 314,572,800 = 10,066,329,600; + 4LHQT 2,147,483,648 = 12,213,813,248
    assert hardware_flops_per_token(LLAMA2_7B, activation_checkpointing=True) == 58_298_728_448


def test_training_flops_per_method() -> None:
    # LoRA r=8 on q and v of Llama-2-7B: 32 layers * 2 * 8*(4096+4096) = 4,194,304 adapter weights
    # 4N = 26,428,309,504 + 12LHQT 6,442,450,944 + 6*4,194,304 = 25,165,824 -> 32,895,926,272
    lora = training_flops_per_token(LLAMA2_7B, 4_194_304, "lora")
    assert lora == 32_895_926_272
    assert training_flops_per_token(LLAMA2_7B, 4_194_304, "qlora") == lora
    assert training_flops_per_token(LLAMA2_7B, 0, "full") == model_flops_per_token(LLAMA2_7B)
    with pytest.raises(ValueError, match="method"):
        training_flops_per_token(LLAMA2_7B, 0, "prefix")


def _preset(name: str) -> Any:
    from omegaconf import OmegaConf

    from pipeline.config.schema import ModelConfig

    return ModelConfig(**OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml")))  # type: ignore[arg-type]


PRESETS = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))


def _hf_config(model: Any) -> Any:
    """The transformers config of a preset, of its own family (model.family, else arch):
    MistralConfig for mistral-7b (grouped-query attention, a sliding window as long as the
    sequence), LlamaConfig for the llama presets, GPT2Config for gpt2."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig

    if model.arch == "gpt2":
        return GPT2Config(
            n_embd=model.hidden,
            n_layer=model.n_layers,
            n_head=model.n_heads,
            n_inner=model.ffn_hidden,
            vocab_size=model.vocab_size,
            n_positions=model.seq_len,
            tie_word_embeddings=model.tie_embeddings,
        )
    cls = {"llama": LlamaConfig, "mistral": MistralConfig}[model.family or model.arch]
    return cls(
        hidden_size=model.hidden,
        intermediate_size=model.ffn_hidden,
        num_hidden_layers=model.n_layers,
        num_attention_heads=model.n_heads,
        num_key_value_heads=model.n_kv_heads,
        vocab_size=model.vocab_size,
        max_position_embeddings=model.seq_len,
        tie_word_embeddings=model.tie_embeddings,
    )


HF_CLASS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "gpt2": "GPT2LMHeadModel"}


@pytest.mark.parametrize("preset", PRESETS)
def test_flops_match_the_flop_counter_on_every_preset(preset: str) -> None:
    """model_flops_per_token of each preset's shape (the analytic formula, arch llama or gpt2)
    against torch's FlopCounterMode over forward and backward of the transformers model of the
    preset's own family (MistralForCausalLM for mistral-7b, not a Llama), independent of
    train/model.py. The figure a run logs is checked in tests/integration/test_models.py."""
    model = _preset(preset)
    shape = ModelShape.of(model)
    built, counted = counted_flops_per_token(_hf_config(model), shape.seq_len)
    assert type(built).__name__ == HF_CLASS[model.family or model.arch]
    assert param_count(shape) == sum(p.numel() for p in built.parameters())
    assert model_flops_per_token(shape) == pytest.approx(counted, rel=0.01)


@pytest.mark.parametrize("preset", ["tiny", "gpt2-125m", "llama-7b", "mistral-7b"])
def test_hardware_flops_match_the_counter_with_activation_checkpointing(preset: str) -> None:
    model = _preset(preset)
    shape = ModelShape.of(model)
    _, counted = counted_flops_per_token(_hf_config(model), shape.seq_len, checkpointing=True)
    assert hardware_flops_per_token(shape, activation_checkpointing=True) == pytest.approx(counted, rel=0.01)


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
