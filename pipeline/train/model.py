"""Causal language models built with Hugging Face transformers, and the method that tunes them.

Every model is `AutoModelForCausalLM.from_config`: a preset (conf/model/) names a real family
(Llama, GPT-2, Mistral, Qwen2: their norms, rotary or learned positions, grouped-query attention,
tied embeddings where the family ties them) and its shape; `model.pretrained` is a local folder
(or a hub name already in the local cache) whose config.json is used as it is, and whose
safetensors weights are loaded unless `model.weights=random`. Nothing is downloaded
(local_files_only). Under ZeRO-3 the model is built through transformers' DeepSpeed
integration (HfDeepSpeedConfig), i.e. inside `deepspeed.zero.Init`: every parameter is
partitioned as it is created, so no rank ever holds the whole model.

The method (peft): `full` trains every weight; `lora` freezes the base and adds LoRA adapters
(Hu et al. 2021); `qlora` also quantizes the frozen linear layers to 4-bit NF4 with
bitsandbytes (Dettmers et al. 2023). Dropout is set to 0 everywhere, so a step is a pure function
of the weights and the batch and resume stays bit-exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config.schema import MethodConfig, ModelConfig

# config.json keys of dropout probabilities, zeroed for bit-exact resume
_DROPOUTS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_first_dropout",
)


class UnsupportedMethod(RuntimeError):
    """The method cannot run here (QLoRA where bitsandbytes has no 4-bit kernels for this
    device): a recorded result, like fp16 on a CPU, not a crash."""


def hf_config(cfg: ModelConfig) -> Any:
    """The transformers config this ModelConfig builds."""
    from transformers import AutoConfig

    if cfg.pretrained:
        hf = AutoConfig.from_pretrained(cfg.pretrained, local_files_only=True)
    else:
        tie = cfg.tie_embeddings
        if cfg.model_type == "gpt2":
            hf = AutoConfig.for_model(
                "gpt2",
                vocab_size=cfg.vocab_size,
                n_embd=cfg.hidden,
                n_layer=cfg.n_layers,
                n_head=cfg.n_heads,
                n_inner=cfg.ffn_hidden,
                n_positions=cfg.seq_len,
                bos_token_id=cfg.vocab_size - 1,
                eos_token_id=cfg.vocab_size - 1,
                tie_word_embeddings=tie,
            )
        else:
            hf = AutoConfig.for_model(
                cfg.model_type,
                vocab_size=cfg.vocab_size,
                hidden_size=cfg.hidden,
                intermediate_size=cfg.ffn_hidden,
                num_hidden_layers=cfg.n_layers,
                num_attention_heads=cfg.n_heads,
                num_key_value_heads=cfg.n_kv_heads,
                max_position_embeddings=cfg.seq_len,
                rms_norm_eps=1e-5,
                tie_word_embeddings=tie,
                bos_token_id=None,
                eos_token_id=None,
                pad_token_id=None,
            )
    for key in _DROPOUTS:
        if isinstance(getattr(hf, key, None), float):
            setattr(hf, key, 0.0)
    return hf


class CausalLM(nn.Module):
    """A transformers causal LM (with its peft adapters, if any). forward(tokens, targets)
    returns the mean cross-entropy of the next-token targets (already shifted).

    Chat batches (pipeline.train.data) add `position_ids` (packed: restarting at 0 at each
    sample, no attention mask, so transformers masks attention block-diagonally) or an
    `attention_mask` (padded), and a `denominator`: the loss is then the summed NLL of the
    targets that are not -100, divided by it (the trainer passes the step's loss-bearing tokens
    over its micro-batches x ranks, so that DeepSpeed's mean over them gives summed NLL / tokens
    of the whole step; the evaluation passes 1 and gets the sum)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        denominator: float | None = None,
    ) -> torch.Tensor:
        if denominator is None:
            logits = self.inner(input_ids=tokens, use_cache=False).logits.float()
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        logits = self.inner(
            input_ids=tokens, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
        ).logits.float()
        nll = F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100, reduction="sum"
        )
        return nll / denominator


@dataclass(frozen=True)
class ParamCounts:
    """Counted on the built model: tied weights once, 4-bit weights as the values they hold,
    ZeRO-3 parameters whole (ds_numel), adapters included in the total."""

    total: int
    trainable: int

    @property
    def trainable_frac(self) -> float:
        return self.trainable / self.total


def _numel(p: torch.Tensor) -> int:
    n = int(getattr(p, "ds_numel", p.numel()))
    if type(p).__name__ == "Params4bit":  # two 4-bit values per stored byte
        n *= 2
    return n


def count_params(model: nn.Module) -> ParamCounts:
    params = list(model.parameters())  # parameters() yields a tied weight once
    return ParamCounts(sum(_numel(p) for p in params), sum(_numel(p) for p in params if p.requires_grad))


def count_params_meta(cfg: ModelConfig) -> int:
    """Parameters of the model `cfg` builds, counted on the meta device (no memory, any size)."""

    with torch.device("meta"):
        model = _from_config(hf_config(cfg))
    return count_params(model).total


@contextlib.contextmanager
def _zero3_build(ds_config: dict[str, Any] | None) -> Iterator[None]:
    """Under ZeRO-3, transformers builds (and loads) the model inside deepspeed.zero.Init while an
    HfDeepSpeedConfig is alive; it is unset afterwards so later builds in the process are not."""
    if not ds_config or ds_config.get("zero_optimization", {}).get("stage") != 3:
        yield
        return
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    keep = HfDeepSpeedConfig(ds_config)
    try:
        yield
    finally:
        del keep
        unset_hf_deepspeed_config()


def routers(model: nn.Module) -> set[str]:
    """Full names of the MoE routers that are linear layers (phimoe's PhimoeTopKRouter is an
    nn.Linear whose forward returns a tuple): a linear module beside an experts container (a
    module holding 3-D expert weights, or a ModuleList of experts) with one output per expert.
    A router is not an adapter target: it picks the experts, and peft's wrapped forward expects
    a tensor out."""
    from transformers.pytorch_utils import Conv1D

    found = set()
    for parent_name, parent in model.named_modules():
        counts = set()
        for child in parent.children():
            if isinstance(child, nn.ModuleList):
                counts.add(len(child))
            counts |= {int(p.shape[0]) for p in child.parameters(recurse=False) if p.dim() == 3}
        for name, child in parent.named_children():
            if isinstance(child, (nn.Linear, Conv1D)) and int(child.weight.shape[0]) in counts:
                found.add(f"{parent_name}.{name}" if parent_name else name)
    return found


def all_linear(model: nn.Module) -> list[str]:
    """peft's "all-linear": the names of every linear layer (nn.Linear, GPT-2's Conv1D) but the
    output head and the MoE routers (`routers`), as peft matches them (the last dotted part).
    Given as a list. peft 0.21 still rewrites such a list on the MoE families transformers
    converts from v4 checkpoints (mixtral, qwen2_moe, deepseek_v3, qwen3_moe, olmoe...: their
    dense MLP names become adapters on the routed experts' 3-D weights): the description
    (pipeline/train/describe.py) counts the adapters of the peft model as built."""
    from transformers.pytorch_utils import Conv1D

    get_head: Any = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    skip = routers(model)
    names = {
        n.rsplit(".", 1)[-1]
        for n, m in model.named_modules()
        if isinstance(m, (nn.Linear, Conv1D)) and m is not head and n not in skip
    }
    return sorted(names)


def lora_config(
    model: nn.Module, targets: list[str], rank: int, alpha: int | None = None, dropout: float = 0.0
) -> Any:
    """The LoraConfig the job trains with (and the description builds on the meta device)."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        lora_dropout=dropout,
        target_modules=list(targets),
        fan_in_fan_out=_conv1d(model, targets),
        bias="none",
    )


def lora_targets(model: nn.Module, method: MethodConfig) -> list[str]:
    """The configured target names (checked against the model before submission), else peft's
    all-linear of this model."""
    return list(method.target_modules) if method.target_modules else all_linear(model)


def with_attention(build: Any, *args: Any, **kwargs: Any) -> Any:
    """`build(*args, attn_implementation=..., **kwargs)` (AutoModelForCausalLM.from_config or
    .from_pretrained) with SDPA attention, or the family's own attention where transformers has
    no SDPA for it (bloom, gemma2: transformers refuses before it reads any weight)."""
    try:
        return build(*args, attn_implementation="sdpa", **kwargs)
    except ValueError as e:
        if "attention implementation" not in str(e) and "attn_implementation" not in str(e):
            raise
        return build(*args, attn_implementation="eager", **kwargs)


def _from_config(hf: Any, **kwargs: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return with_attention(AutoModelForCausalLM.from_config, hf, **kwargs)


def check_method(
    method: MethodConfig, device: str, dtype: torch.dtype, zero_stage: int, offload_param: str
) -> None:
    """QLoRA needs a ZeRO layout that keeps the 4-bit base whole, and bitsandbytes' 4-bit kernels
    on this device: quantize a small layer and run a forward and backward through it; what fails
    is the reason of an unsupported_method result."""
    if method.name != "qlora":
        return
    why = method.cannot_run_with(zero_stage, offload_param)
    if why is not None:
        raise UnsupportedMethod(why)
    try:
        import bitsandbytes as bnb

        layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=dtype, quant_type="nf4")
        layer.weight = bnb.nn.Params4bit(torch.randn(64, 64), requires_grad=False, quant_type="nf4")
        layer = layer.to(device)
        x = torch.randn(2, 64, device=device, dtype=dtype, requires_grad=True)
        layer(x).float().sum().backward()
    except Exception as e:
        raise UnsupportedMethod(
            f"qlora: bitsandbytes 4-bit does not run on {device} ({type(e).__name__}: {str(e).splitlines()[0][:300]})"
        ) from e


def _quantize_linears(model: nn.Module, dtype: torch.dtype) -> None:
    """QLoRA's base: every linear layer but the output head (whatever the family names it) and the MoE routers becomes a frozen bitsandbytes
    Linear4bit (NF4, double quantization), quantized from the weights it had."""
    import bitsandbytes as bnb
    from transformers.pytorch_utils import Conv1D

    get_head: Any = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    keep = routers(model)  # a router's own forward (phimoe's returns a tuple) stays as it is
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if child is head or name == "lm_head" or not isinstance(child, (nn.Linear, Conv1D)):
                continue
            if (f"{parent_name}.{name}" if parent_name else name) in keep:
                continue
            weight = (
                child.weight.data.t() if isinstance(child, Conv1D) else child.weight.data
            )  # Conv1D: (in, out)
            out_f, in_f = weight.shape
            q = bnb.nn.Linear4bit(
                in_f,
                out_f,
                bias=child.bias is not None,
                compute_dtype=dtype,
                compress_statistics=True,
                quant_type="nf4",
            )
            param: Any = bnb.nn.Params4bit(
                weight.contiguous(), requires_grad=False, compress_statistics=True, quant_type="nf4"
            )
            q.weight = param.to("cpu")  # quantizes (Params4bit.to on an unquantized weight)
            # on a CPU with AVX512-BF16, bitsandbytes repacks the weight for its inference kernel
            # the first time the layer runs in eval mode, for good: training after an evaluation
            # then takes that kernel (no autograd; with a bias, an in-place add that raises)
            q.support_avx512bf16_for_cpu = False
            if child.bias is not None:
                q.bias = nn.Parameter(child.bias.data.clone(), requires_grad=False)
            setattr(parent, name, q)


def _conv1d(model: nn.Module, targets: list[str]) -> bool:
    """Whether the targets are GPT-2 style Conv1D layers, which store (in, out): peft's
    fan_in_fan_out (4-bit layers are plain (out, in) again)."""
    from transformers.pytorch_utils import Conv1D

    return any(isinstance(m, Conv1D) and n.rsplit(".", 1)[-1] in targets for n, m in model.named_modules())


def build_model(
    cfg: ModelConfig,
    method: MethodConfig | None = None,
    activation_checkpointing: bool = False,
    seed: int = 0,
    ds_config: dict[str, Any] | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> CausalLM:
    """The model and its method, in fp32 (DeepSpeed casts for bf16): random init from `seed` or
    the pretrained weights, identical on every rank and every attempt."""
    from transformers import AutoModelForCausalLM

    method = method or MethodConfig()
    hf = hf_config(cfg)
    torch.manual_seed(seed)
    with _zero3_build(ds_config):
        if cfg.loads_weights:
            assert cfg.pretrained is not None
            inner = with_attention(
                AutoModelForCausalLM.from_pretrained,
                cfg.pretrained,
                config=hf,
                local_files_only=True,
                dtype=torch.float32,
            )
        else:
            inner = _from_config(hf, dtype=torch.float32)
    if activation_checkpointing:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method.adapters:
        from peft import get_peft_model

        if method.name == "qlora":
            _quantize_linears(inner, compute_dtype)
        targets = lora_targets(inner, method)
        lora = lora_config(inner, targets, method.lora_rank, method.lora_alpha, method.lora_dropout)
        torch.manual_seed(seed + 1)  # adapter init: same on every rank and attempt
        return CausalLM(get_peft_model(inner, lora))
    return CausalLM(inner)
