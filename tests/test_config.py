"""Composition and validation: every config composes, bad input fails with one clear paragraph
before anything starts, and the sweep grid expands as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import compose, qualify

from pipeline.config.compose import compose_sweep, expand_grid
from pipeline.config.schema import ConfigError, ParallelismConfig, PrecisionConfig, SweepConfig, TrainConfig
from pipeline.home import conf_dir
from pipeline.train.trainer import build_ds_config

CONF_DIR = conf_dir()

GROUPS = ["model", "precision", "parallelism", "partition", "drill", "cost", "sweep"]


@pytest.mark.parametrize(
    "group,option",
    [(g, f.stem) for g in GROUPS for f in sorted((CONF_DIR / g).glob("*.yaml"))],
)
def test_every_option_composes(group: str, option: str) -> None:
    cfg = compose([f"{group}={option}"])
    section = getattr(cfg, group)
    if hasattr(section, "name") and group != "drill":
        assert section.name == option


def test_every_sweep_preset_composes_all_points() -> None:
    for preset in sorted((CONF_DIR / "sweep").glob("*.yaml")):
        points = compose_sweep(preset.stem)
        assert points, preset
        assert len({p.point_id for p in points}) == len(points), f"duplicate point ids in {preset.stem}"


BAD = [
    (["model=gpt5"], ["model/gpt5", "Available options", "tiny", "llama-7b"]),
    (["partition=tpu"], ["partition/tpu", "a100", "h100", "local"]),
    (["parallelism.zero_stage=5"], ["parallelism.zero_stage", "5", "0, 1, 2 or 3"]),
    (["precision=fp12"], ["precision/fp12", "bf16", "fp16", "fp32"]),
    (["parallelism.micro_batch=-1"], ["parallelism.micro_batch", "-1", ">= 1"]),
    (["parallelism.zero_stag=2"], ["zero_stag", "Did you mean 'parallelism.zero_stage'", "micro_batch"]),
    (["train.steps=abc"], ["train.steps=abc", "Integer"]),
    (["parallelism.offload_param=cpu", "parallelism=zero2"], ["offload_param", "zero_stage == 3"]),
]


@pytest.mark.parametrize("overrides,needles", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_names_key_and_allowed_values(overrides: list[str], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in: {msg}"
    assert "Nothing was submitted" in msg
    assert "\n\n" not in msg  # one paragraph


@pytest.mark.parametrize("overrides", [o for o, _ in BAD[:6]], ids=[" ".join(o) for o, _ in BAD[:6]])
def test_cli_refuses_bad_input_and_starts_nothing(tmp_path: Path, overrides: list[str]) -> None:
    runs = tmp_path / "runs"
    db = tmp_path / "mlruns.db"
    res = qualify(
        ["sweep", "--launcher", "local", f"runs_dir={runs}", f"tracking.uri=sqlite:///{db}", *overrides]
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("error: Bad config")
    assert not runs.exists(), "a sweep folder was created for bad input"
    assert not db.exists(), "MLflow was touched for bad input"


def test_semantic_point_checks_report_every_problem() -> None:
    from pipeline.config.validate import check_points

    a = compose(["partition=h100", "parallelism.gpus_per_node=8"])
    b = compose(
        ["partition=h200", "partition.time_limit_min=45", "drill=checkpoint", "drill.checkpoint.at_step=50"]
    )
    with pytest.raises(ConfigError) as err:
        check_points([("a", a), ("b", b)])
    msg = str(err.value)
    assert "4 problem(s)" in msg  # 8 ranks' runtimes (2 GiB each) are also more than h100's 16 GB per node
    assert "host memory: h100 nodes would need" in msg
    assert "gpus_per_node=8 is more than partition 'h100' has per node" in msg
    assert "over partition 'h200' MaxTime (30 min)" in msg
    assert "drill.checkpoint.at_step=50" in msg


def test_grid_expands_product_then_extras() -> None:
    sweep = SweepConfig(
        grid={"model": ["tiny"], "precision": ["fp32", "bf16"], "parallelism": ["zero1", "zero2"]},
        extra=[["precision=fp16", "parallelism=zero2"]],
        overrides=["train.steps=10"],
    )
    points = expand_grid(sweep)
    assert len(points) == 5
    assert points[0] == ["model=tiny", "precision=fp32", "parallelism=zero1", "train.steps=10"]
    assert points[-1] == ["precision=fp16", "parallelism=zero2", "train.steps=10"]


def test_user_override_narrows_axis_and_extras_and_adds_axes() -> None:
    sweep = SweepConfig(grid={"precision": ["fp32", "bf16"]}, extra=[["precision=fp16"]])
    assert expand_grid(sweep, ["precision=fp32"]) == [["precision=fp32"]]
    points = expand_grid(sweep, ["precision=bf16", "train.seed=1,2", "train.steps=5"])
    assert points == [
        ["precision=bf16", "train.seed=1", "train.steps=5"],
        ["precision=bf16", "train.seed=2", "train.steps=5"],
    ]


def test_default_sweep_is_the_documented_cpu_grid() -> None:
    points = compose_sweep("default")
    combos = sorted((p.cfg.precision.name, p.cfg.parallelism.zero_stage) for p in points)
    assert combos == sorted([(pr, z) for pr in ("fp32", "bf16") for z in (1, 2, 3)] + [("fp16", 2)])
    assert all(p.cfg.drill.checkpoint.enabled and p.cfg.partition.name == "local" for p in points)


def test_drills_combine() -> None:
    cfg = compose(["drill=[checkpoint,none]"])
    assert cfg.drill.enabled_names() == ["checkpoint"]


def test_ds_config_is_derived_from_the_sections() -> None:
    par = ParallelismConfig(
        zero_stage=3, offload_optimizer="cpu", micro_batch=2, grad_accum=4, gpus_per_node=4, nodes=2
    )
    ds = build_ds_config(par, PrecisionConfig(name="bf16"), TrainConfig(lr=1e-4))
    assert ds["train_batch_size"] == 2 * 4 * 8
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["bf16"] == {"enabled": True} and ds["fp16"]["enabled"] is False
    assert ds["optimizer"]["type"] == "AdamW" and ds["optimizer"]["params"]["lr"] == 1e-4
    plain = build_ds_config(ParallelismConfig(zero_stage=1), PrecisionConfig(name="fp32"), TrainConfig())
    assert "optimizer" not in plain  # torch AdamW is passed in: bit-exact resume
    json.dumps(plain)


def test_every_sweep_and_drill_config_is_exercised_by_a_test() -> None:
    """Meta-test: a preset or drill nobody runs is a preset that silently rots."""
    tests = "\n".join(
        p.read_text() for p in Path(__file__).parent.glob("test_*.py") if p.name != Path(__file__).name
    )
    for group in ("sweep", "drill"):
        for option in sorted((CONF_DIR / group).glob("*.yaml")):
            name = option.stem
            used = f"{group}={name}" in tests or f'"{name}"' in tests or f"'{name}'" in tests
            assert used, f"conf/{group}/{name}.yaml is not used by any test module"


def test_reshape_drill_points_that_cannot_run_are_refused() -> None:
    from pipeline.config.validate import check_points

    bad = {
        "three": compose(["drill=reshape", "drill.reshape.world_size=3"]),  # not fewer than 2, nor a divisor
        "zero3": compose(["drill=reshape", "parallelism=zero3"]),
        "late": compose(["drill=reshape", "drill.reshape.at_step=20", "train.steps=20"]),
        "mixed": compose(["drill=[reshape,preempt]"]),
    }
    with pytest.raises(ConfigError) as err:
        check_points(list(bad.items()))
    msg = str(err.value)
    assert "4 problem(s)" in msg
    assert "three: drill.reshape.world_size=3 must be fewer ranks than the run's 2" in msg
    assert "zero3: drill.reshape needs parallelism.zero_stage 1 or 2 (is 3)" in msg
    assert "late: drill.reshape.at_step=20 must be in [1, train.steps=20)" in msg
    assert "mixed: drill.reshape does not combine with preempt" in msg
    check_points([("ok", compose(["drill=reshape"]))])
