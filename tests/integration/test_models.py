"""Models through transformers and the method axis (issue #11), on files the tests make: a tiny
model of each family built from a config, saved with save_pretrained and loaded back through
model.pretrained, with and without its weights; LoRA and QLoRA through peft and bitsandbytes;
every bad input a one-paragraph error before anything is submitted."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.config.schema import ConfigError, MethodConfig
from pipeline.config.validate import method_grid_problems, point_problems
from pipeline.measure.flops import ModelShape, param_count
from pipeline.train.model import build_model, count_params, count_params_meta
from tests.support.helpers import compose, point_runs, qualify

# Published parameter counts (the model cards / papers; transformers reports the same).
PUBLISHED = {
    "gpt2-125m": 124_439_808,  # GPT-2 small
    "llama-7b": 6_738_415_616,  # Llama-2-7B
    "mistral-7b": 7_241_732_096,  # Mistral-7B-v0.1
}
LLAMA_32_1B = 1_235_814_400  # Llama-3.2-1B, whose lm_head is tied to the embedding
PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "model").glob("*.yaml"))


def tiny_hf_config(family: str, hidden: int = 64) -> Any:
    from transformers import AutoConfig

    if family == "gpt2":
        return AutoConfig.for_model(
            "gpt2",
            vocab_size=128,
            n_embd=hidden,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
    return AutoConfig.for_model(
        family,
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=family == "qwen2",  # as the small Qwen2 models do
    )


def save_tiny(folder: Path, family: str, weights: bool = True, hidden: int = 64) -> Any:
    """A tiny model of `family`, saved as a user's folder: config.json (+ model.safetensors)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(family, hidden))
    model.save_pretrained(folder)
    if not weights:
        for f in folder.glob("*.safetensors"):
            f.unlink()
    return model


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_counts_built_formula_published(preset: str) -> None:
    cfg = compose([f"model={preset}"]).model
    built = count_params_meta(cfg)  # transformers' model, on the meta device
    assert built == param_count(ModelShape.of(cfg))  # the analytic formula of the shape
    if preset in PUBLISHED:
        assert built == PUBLISHED[preset]


def test_llama_1b_tied_matches_llama_3_2_1b() -> None:
    cfg = compose(["model=llama-1b"]).model
    # ModelConfig.tie_embeddings comes with issue #10; the builder already reads it
    cfg.tie_embeddings = True  # type: ignore[attr-defined]
    assert count_params_meta(cfg) == LLAMA_32_1B


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral", "qwen2"])
def test_pretrained_folder_with_and_without_weights(tmp_path: Path, family: str) -> None:
    saved = save_tiny(tmp_path / "with", family)
    save_tiny(tmp_path / "without", family, weights=False)
    cfg = compose([f"model.pretrained={tmp_path / 'with'}", "model.seq_len=32"]).model
    assert (cfg.name, cfg.model_type, cfg.vocab_size, cfg.n_layers, cfg.hidden) == (
        "with",
        family,
        128,
        2,
        64,
    )
    assert cfg.loads_weights
    loaded = build_model(cfg, seed=1).inner
    want = saved.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want), "the saved weights must be loaded"
    assert count_params(loaded).total == sum(p.numel() for p in saved.parameters())

    bare = compose([f"model.pretrained={tmp_path / 'without'}", "model.seq_len=32"]).model
    assert not bare.loads_weights
    a, b = build_model(bare, seed=1).inner.state_dict(), build_model(bare, seed=1).inner.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "random init is a function of the seed"
    assert not all(torch.equal(a[k], want[k]) for k in want)
    rnd = compose([f"model.pretrained={tmp_path / 'with'}", "model.weights=random", "model.seq_len=32"]).model
    assert not rnd.loads_weights


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])  # qwen2: attention biases
def test_lora_and_qlora_train_only_adapters(tmp_path: Path, family: str) -> None:
    save_tiny(tmp_path / "m", family, hidden=256)
    cfg = compose([f"model.pretrained={tmp_path / 'm'}", "model.seq_len=32"]).model
    full = count_params(build_model(cfg))
    assert full.trainable == full.total
    lora_model = build_model(cfg, MethodConfig(name="lora", lora_rank=4))
    lora = count_params(lora_model)
    assert lora.trainable_frac < 0.05 and lora.total == full.total + lora.trainable
    assert all("lora_" in n for n, p in lora_model.named_parameters() if p.requires_grad)
    x = torch.randint(0, 128, (2, 32))
    lora_model(x, x).backward()  # gradients reach the adapters through the frozen base
    assert all(p.grad is not None for p in lora_model.parameters() if p.requires_grad)

    qlora_model = build_model(cfg, MethodConfig(name="qlora", lora_rank=4))
    kinds = {type(m).__name__ for m in qlora_model.modules()}
    assert "Linear4bit" in kinds  # the base is 4-bit NF4 (bitsandbytes)
    q = count_params(qlora_model)
    assert q.trainable == lora.trainable and q.total == lora.total  # 4-bit weights counted as values
    qlora_model.eval()  # an evaluation first, as the run does: training after it still works
    with torch.no_grad():
        assert torch.isfinite(qlora_model(x, x))
    qlora_model.train()
    loss = qlora_model(x, x)
    assert torch.isfinite(loss)
    loss.backward()  # through the 4-bit base to every adapter, the first layer's included
    # lora_B starts at 0 (so lora_A's first gradient is 0); every B has one, the first layer's
    # only through the 4-bit base of every layer above it
    b_grads = {n: p.grad for n, p in qlora_model.named_parameters() if "lora_B" in n}
    assert b_grads and all(g is not None and bool(g.abs().sum() > 0) for g in b_grads.values()), [
        n for n, g in b_grads.items() if g is None or not bool(g.abs().sum() > 0)
    ]


BAD = [
    (["model.pretrained={tmp}/nope"], "is not a folder"),
    (["model.pretrained={tmp}/empty"], "has no config.json"),
    (
        ["model.pretrained={tmp}/bert"],
        "is an encoder (bidirectional attention), not a decoder-only causal language model",
    ),
    (["model.pretrained=nobody-org/no-such-model-xyz"], "is not in the local Hugging Face cache"),
    (["model.pretrained={tmp}/bare", "model.weights=pretrained"], "has no *.safetensors weights"),
    (["method=lora", "method.lora_rank=0"], "method.lora_rank"),
    (["method=lora", "method.lora_rank=two"], "lora_rank"),
    (["method=qlora", "parallelism=zero3"], "method=qlora needs parallelism.zero_stage 0, 1 or 2"),
    (["method=lora", "method.target_modules=[q_proj,wq]"], "has no linear layer named wq"),
    (
        ["model.pretrained={tmp}/gpt", "method=lora", "method.target_modules=[q_proj]"],
        "gpt2 model has no linear layer named q_proj; its linear layers are c_attn, c_fc, c_proj, lm_head",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_paragraph(tmp_path: Path, overrides: list[str], message: str) -> None:
    from transformers import BertConfig

    (tmp_path / "empty").mkdir()
    BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(
        tmp_path / "bert"
    )
    (tmp_path / "bare").mkdir()
    tiny_hf_config("llama").save_pretrained(tmp_path / "bare")
    (tmp_path / "gpt").mkdir()
    tiny_hf_config("gpt2").save_pretrained(tmp_path / "gpt")
    ovs = [o.replace("{tmp}", str(tmp_path)) for o in overrides]
    try:
        cfg = compose(ovs)
        problems = point_problems(cfg) + [
            line.split(": ", 1)[1] for line in method_grid_problems([("p", cfg)])
        ]
    except ConfigError as e:
        problems = [str(e)]
    assert len(problems) == 1 and message in problems[0], problems
    assert "\n" not in problems[0]


def test_bad_model_exits_2_before_submitting(tmp_path: Path) -> None:
    res = qualify(
        [
            "sweep",
            "--sweep",
            "smoke",
            "--launcher",
            "local",
            f"runs_dir={tmp_path}",
            "model.pretrained=/no/such",
        ]
    )
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "model.pretrained" in res.stderr and not list(tmp_path.iterdir())


def test_qlora_where_a_grid_crosses_zero3_is_a_recorded_result_not_a_refusal() -> None:
    from pipeline.job.results import classify
    from pipeline.train.model import UnsupportedMethod, check_method

    grid = [(f"p{z}", compose(["method=qlora", f"parallelism=zero{z}"])) for z in (1, 2, 3)]
    assert method_grid_problems(grid) == [], "zero1 and zero2 run: the zero3 point stays in the sweep"
    only = [grid[2], ("full", compose(["parallelism=zero3"]))]
    (line,) = method_grid_problems(only)  # no qlora point of the sweep can run: bad input
    assert line.startswith("  p3: method=qlora needs parallelism.zero_stage 0, 1 or 2")
    with pytest.raises(UnsupportedMethod) as e:  # the job records it before building anything
        check_method(grid[2][1].method, "cpu", torch.float32, 3, "none")
    assert classify(e.value) == (
        "failed",
        "unsupported_method",
        f"UnsupportedMethod: {line.split(': ', 1)[1]}",
    )
    check_method(grid[1][1].method, "cpu", torch.float32, 2, "none")  # runs here (bitsandbytes CPU 4-bit)


@pytest.mark.slow
def test_local_sweep_full_lora_qlora(tmp_path: Path, sqlite_uri: str) -> None:
    """The acceptance sweep: a user's folder, method=full,lora,qlora, every point to an outcome;
    LoRA trains < 5% of the parameters and is accepted; QLoRA runs or is recorded unsupported."""
    save_tiny(tmp_path / "my-llama", "llama", hidden=256)
    runs = tmp_path / "runs"
    res = qualify(
        [
            "sweep",
            "--sweep",
            "smoke",
            "--launcher",
            "local",
            f"runs_dir={runs}",
            f"tracking.uri={sqlite_uri}",
            f"model.pretrained={tmp_path / 'my-llama'}",
            "model.seq_len=32",
            "method=full,lora,qlora",  # every other setting at its default
            "train.measure_ceiling=false",
            "train.measure_comm=false",
        ]
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs_by = {r.data.tags["sq.method"]: r for r in point_runs(sqlite_uri)}
    assert set(runs_by) == {"full", "lora", "qlora"}
    for method, r in runs_by.items():
        assert f"/my-llama/{method}" in r.data.tags["sq.candidate"]
        outcome, reason = r.data.tags["sq.outcome"], r.data.tags["sq.reason"]
        if method == "qlora" and reason == "unsupported_method":
            assert r.data.tags["sq.reason_detail"]
            continue
        m = r.data.metrics
        assert outcome == "accepted", (method, reason, r.data.tags.get("sq.reason_detail"))
        assert m["ckpt/verified"] == 1.0
        if method != "full":
            assert m["train/trainable_params"] < 0.05 * m["train/params"]
            # adapters: 4N + 12LHQT + 6 x the adapters' parameters (the frozen base has no weight
            # gradients: pipeline.measure.flops.training_flops_per_token), below the full 6N + 12LHQT
            assert (
                0
                < m["perf/model_flops_per_token"]
                < runs_by["full"].data.metrics["perf/model_flops_per_token"]
            )
    # the full run's logged FLOPs against torch's counter on the user's own model
    assert runs_by["full"].data.metrics["perf/model_flops_per_token"] == pytest.approx(
        _counted(tmp_path / "my-llama", 32), rel=0.01
    )
    # the adapter checkpoint holds the adapters and their optimizer state, not the frozen base
    full_bytes = runs_by["full"].data.metrics["ckpt/bytes"]
    assert runs_by["lora"].data.metrics["ckpt/bytes"] < 0.2 * full_bytes
    manifest = json.loads(next(runs.iterdir()).joinpath("manifest.json").read_text())
    assert len(manifest["points"]) == 3


def _counted(folder: Path, seq_len: int) -> float:
    from tests.support.flop_counter import counted_flops_of_folder

    return counted_flops_of_folder(folder, seq_len)


def _row(model: str, method: str, partition: str, usd_per_ckpt: float, headroom: float) -> Any:
    from analysis.runs import RunRecord
    from analysis.table import Row

    run = RunRecord(
        f"{partition}-{method}", "r", "FINISHED", 0, {"sq.outcome": "accepted", "sq.method": method}, {}, {}
    )
    row = Row(
        f"{partition}/{model}/{method}/bf16/zero2", partition, model, "bf16", "zero2", [run], method=method
    )
    row.per_checkpoint, row.per_finished_run = usd_per_ckpt, usd_per_ckpt
    row.values = {"mem/headroom_frac": headroom}
    return row


def test_report_cheapest_per_model_and_method_and_the_winner() -> None:
    from analysis.report import method_list
    from analysis.table import method_verdicts, recommend_by_method

    rows = [
        _row("m8b", "full", "h100", 9.0, 0.20),
        _row("m8b", "full", "h200", 7.0, 0.45),
        _row("m8b", "lora", "a100", 2.0, 0.60),
        _row("m8b", "lora", "h100", 3.0, 0.70),
        _row("m8b", "qlora", "l40s", 2.5, 0.30),
        _row("tiny", "full", "a100", 1.0, 0.9),
    ]
    best = recommend_by_method(rows)
    assert {k: v[0].partition for k, v in best.items() if v[0]} == {
        ("m8b", "full"): "h200",
        ("m8b", "lora"): "a100",
        ("m8b", "qlora"): "l40s",
        ("tiny", "full"): "a100",
    }
    (v,) = method_verdicts(rows)  # tiny ran only full: no verdict for it
    assert v.full is rows[1] and v.adapter is rows[2] and v.winner is rows[2]
    text = "\n".join(method_list(rows))
    assert "m8b x lora: a100/m8b/lora/bf16/zero2" in text and "headroom 60%" in text
    assert "m8b: the lora fine-tune wins: a100/m8b/lora/bf16/zero2" in text
    assert "against h200/m8b/full/bf16/zero2" in text


@pytest.mark.parametrize(
    ("family", "targets"), [("llama", []), ("llama", ["q_proj", "v_proj"]), ("gpt2", [])]
)
def test_adapter_params_formula_equals_built_model(family: str, targets: list[str]) -> None:
    from pipeline.config.pretrained import describe
    from pipeline.config.schema import ModelConfig
    from pipeline.measure.describe import adapter_params

    cfg = ModelConfig(
        arch=family,
        n_layers=3,
        hidden=96,
        n_heads=4,
        n_kv_heads=2 if family == "llama" else 4,
        ffn_hidden=160,
    )
    built = count_params(
        build_model(cfg, MethodConfig(name="lora", lora_rank=4, target_modules=targets))
    ).trainable
    assert adapter_params(describe(cfg, targets), 4, targets) == built


@pytest.mark.parametrize("rank", [4, 32])
def test_memory_query_counts_the_configured_adapters(rank: int) -> None:
    from pipeline.config.validate import memory_query

    cfg = compose(["method=lora", f"method.lora_rank={rank}", "method.target_modules=[q_proj,v_proj]"])
    built = count_params(build_model(cfg.model, cfg.method)).trainable
    assert memory_query(cfg).trainable_params == built  # the rank and targets of the point, not a default


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_adapters_on_a_frozen_random_base_reach_the_synthetic_loss_bound(tmp_path: Path, method: str) -> None:
    """The default quality bar is within reach of adapters: the defaults' steps, lr, clipping and
    global batch (ranks x micro-batch) on the default task, for a random-init user model with a
    512-token vocabulary (counting over the whole vocabulary, adapters stayed above the bound)."""
    from transformers import AutoModelForCausalLM

    from pipeline.train.data import SyntheticTask

    hf = tiny_hf_config("llama")
    hf.vocab_size = 512
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(hf).save_pretrained(tmp_path / "m")
    cfg = compose([f"model.pretrained={tmp_path / 'm'}", f"method={method}"])
    model = build_model(cfg.model, cfg.method, seed=cfg.train.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    task = SyntheticTask(cfg.model.vocab_size, cfg.model.seq_len, cfg.train.seed, cfg.data.alphabet)
    batch = cfg.parallelism.micro_batch * cfg.parallelism.world_size * cfg.parallelism.grad_accum
    losses = []
    for step in range(1, cfg.train.steps + 1):
        x, y = task.batch(step, 0, 0, batch)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
        opt.step()
        losses.append(loss.item())
    bound = cfg.train.loss_bound_frac * math.log(cfg.model.vocab_size)
    assert sum(losses[-3:]) / 3 < bound < losses[0], (losses[0], losses[-3:], bound)
