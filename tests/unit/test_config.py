"""Composition and validation: every config composes, bad input fails with one clear paragraph
before anything starts, and the sweep grid expands as documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.config.compose import compose_sweep, expand_grid
from pipeline.config.resolved import config_from_yaml
from pipeline.config.schema import (
    ConfigError,
    CostConfig,
    ParallelismConfig,
    PrecisionConfig,
    SweepConfig,
    TrainConfig,
)
from pipeline.home import conf_dir
from pipeline.train.trainer import build_ds_config
from tests.support.helpers import compose

CONF_DIR = conf_dir()

GROUPS = ["model", "precision", "parallelism", "partition", "drill", "data", "cost", "sweep"]
# what an option cannot compose without (drill=kill_worker resumes from an interval checkpoint)
NEEDS = {
    "drill=kill_worker": ["train.checkpoint_interval=5"],
    # a real-data option needs its data (whether the files exist is checked before submission)
    "data=tokens": ["data.path=train.bin"],
    "data=text": ["data.path=corpus.jsonl", "data.tokenizer=tokenizer"],
    "data=chat": ["data.path=chat.jsonl", "data.tokenizer=tokenizer"],
}


@pytest.mark.parametrize(
    "group,option",
    [(g, f.stem) for g in GROUPS for f in sorted((CONF_DIR / g).glob("*.yaml"))],
)
def test_every_option_composes(group: str, option: str) -> None:
    choice = f"{group}={option}"
    cfg = compose([choice, *NEEDS.get(choice, [])])
    section = getattr(cfg, group)
    if group == "drill":  # an option enables the drill it names, and only that one
        assert section.enabled_names() == ([] if option == "none" else [option])
    elif group == "cost":
        assert option == "default" and section == CostConfig()  # the schema's defaults, stated once
    else:
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
def test_cli_refuses_bad_input_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str]
) -> None:
    """The CLI's entry point in this process (as a separate command: test_bad_input)."""
    from pipeline import cli

    runs = tmp_path / "runs"
    db = tmp_path / "mlruns.db"
    rc = cli.main(
        ["sweep", "--launcher", "local", f"runs_dir={runs}", f"tracking.uri=sqlite:///{db}", *overrides]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: Bad config")
    assert not runs.exists(), "a sweep folder was created for bad input"
    assert not db.exists(), "MLflow was touched for bad input"


def test_semantic_point_checks_report_every_problem() -> None:
    from pipeline.config.validate import check_points

    a = compose(["partition=ci_h100", "parallelism.gpus_per_node=8"])  # the test cluster: 4 per node
    b = compose(
        [
            "partition=ci_h200",
            "partition.time_limit_min=45",
            "drill=checkpoint",
            "drill.checkpoint.at_step=50",
        ]
    )
    with pytest.raises(ConfigError) as err:
        check_points([("a", a), ("b", b)])
    msg = str(err.value)
    assert "4 problem(s)" in msg  # 8 ranks' runtimes (2 GiB each) are also more than the 16 GB asked
    assert "host memory: ci_h100 nodes would need" in msg
    assert "gpus_per_node=8 is more than partition 'ci_h100' has per node" in msg
    assert "over partition 'ci_h200' MaxTime (30 min)" in msg
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
    assert combos == sorted((pr, z) for pr in ("fp32", "bf16") for z in (1, 2, 3))
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
    plain = build_ds_config(
        ParallelismConfig(zero_stage=1, gpus_per_node=2), PrecisionConfig(name="fp32"), TrainConfig()
    )
    assert "optimizer" not in plain  # torch AdamW is passed in: bit-exact resume
    json.dumps(plain)


def _runs_option(group: str, name: str, text: str) -> bool:
    """Whether test source `text` runs `group` option `name`: an override `drill=name`, a drill
    list `drill=[a,name]`, a preset passed as `--sweep name` (also split over list items) or
    planned with `compose_sweep("name")` (a GPU preset can only be planned here)."""
    n = re.escape(name)
    patterns = [rf"\b{group}={n}\b", rf"\b{group}=\[[^\]]*\b{n}\b[^\]]*\]"]
    if group == "sweep":
        patterns += [rf"--sweep[\"',\s]+{n}\b", rf"(compose_sweep|plan)\([\"']{n}[\"']"]
    return any(re.search(p, text) for p in patterns)


def test_the_usage_check_needs_a_real_use() -> None:
    assert _runs_option("drill", "none", 'compose(["drill=none"])')
    assert _runs_option("drill", "preempt", 'compose(["drill=[checkpoint,preempt]"])')
    assert _runs_option("sweep", "smoke", 'qualify(["sweep", "--sweep",\n "smoke"])')
    assert not _runs_option("drill", "none", "assert label == \"none\"  # or 'none'")
    assert not _runs_option("drill", "time", "drill=timeout")
    assert not _runs_option("sweep", "smoke", 'assert name == "smoke"  # a mention is not a run')


def test_every_sweep_and_drill_config_is_exercised_by_a_test() -> None:
    """Meta-test: a preset or drill nobody runs is a preset that silently rots. This module
    composes every option and does not count."""
    tests = "\n".join(
        p.read_text()
        for p in Path(__file__).resolve().parents[1].rglob("test_*.py")
        if p.name != Path(__file__).name
    )
    for group in ("sweep", "drill"):
        for option in sorted((CONF_DIR / group).glob("*.yaml")):
            assert _runs_option(group, option.stem, tests), (
                f"conf/{group}/{option.name} is run by no test module"
            )


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


SNAPSHOT = Path(__file__).parent / "data" / "composed_config.json"


def _leaves(node: object, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict) and node:
        out: dict[str, object] = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def test_composed_values_equal_the_recorded_snapshot() -> None:
    """Moving a value between the schema, a base file and a variant must not change it: every
    value recorded in tests/unit/data/composed_config.json (the default config, and each group
    option's own section) composes to the same value today. Keys added since are allowed."""
    from pipeline.config.compose import as_dict

    recorded = json.loads(SNAPSHOT.read_text())
    for choice, section in recorded.items():
        if choice == "default":
            now = as_dict(compose([]))
        else:
            group = choice.split("=", 1)[0]
            now = {group: as_dict(compose([choice, *NEEDS.get(choice, [])]))[group]}
            section = {group: section}
        got = _leaves(now)
        for key, value in _leaves(section).items():
            assert key in got, f"{choice}: {key} is gone"
            assert got[key] == value, f"{choice}: {key} was {value!r}, composes to {got[key]!r}"


def test_every_key_is_documented_once_in_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """`qualify list --keys` prints every key with its type, default and the docstring under its
    schema field; a field without one fails here."""
    from pipeline.cli import main
    from pipeline.config.keys import all_keys

    keys = all_keys()
    assert [k.key for k in keys if not k.doc] == []
    assert len({k.key for k in keys}) == len(keys) > 90
    assert main(["list", "--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(keys)
    lr = next(line for line in lines if line.startswith("train.lr "))
    assert lr.split()[1:3] == ["float", "0.003"] and "AdamW learning rate, finite > 0." in lr
    uri = next(line for line in lines if line.startswith("tracking.uri "))
    assert "str | None" in uri and "null" in uri and "file://" in uri
    assert any(line.startswith("drill.kill_worker.rank ") for line in lines)
    assert not any(line.startswith("drill.name ") for line in lines)


@pytest.mark.parametrize("preset", sorted(f.stem for f in (CONF_DIR / "sweep").glob("*.yaml")))
def test_a_drill_list_is_one_value_in_every_preset(preset: str) -> None:
    """The README's `drill=[checkpoint,preempt]` enables both drills on every point of any
    preset (it replaces the preset's drill axis), instead of being split on its comma."""
    points = compose_sweep(preset, ["drill=[checkpoint,preempt]"])
    assert points and all(p.cfg.drill.enabled_names() == ["checkpoint", "preempt"] for p in points)
    assert all("drill=[checkpoint,preempt]" in p.overrides for p in points)
    assert config_from_yaml(points[0].yaml) == points[0].cfg  # the job reads back the same point


def test_sweeps_lists_and_group_removal_follow_hydra_grammar() -> None:
    sweep = SweepConfig(grid={"drill": ["checkpoint"]}, extra=[["drill=checkpoint", "precision=fp16"]])
    assert expand_grid(sweep, ["train.seed=range(1,3)", "drill=[checkpoint,preempt]"]) == [
        ["drill=[checkpoint,preempt]", "train.seed=1"],
        ["drill=[checkpoint,preempt]", "train.seed=2"],
    ]  # the extra point has another drill value: narrowed away
    assert expand_grid(sweep, ["drill=checkpoint,none"]) == [
        ["drill=checkpoint"],
        ["drill=none"],
        ["drill=checkpoint", "precision=fp16"],
    ]
    assert compose(["drill=checkpoint", "~drill"]).drill.enabled_names() == []
    assert compose(["++train.steps=7"]).train.steps == 7


FAST_PATH_POINTS = [
    ["model=tiny", "train.seed=7"],
    ["model=tiny", "train.lr=1", "train.steps=30"],  # an int given for a float
    ["model=tiny", "method=lora", "method.target_modules=[q_proj,v_proj]", "method.lora_rank=4"],
    ["partition=a100", "partition.account=null", "partition.qos=high", "drill=[checkpoint,preempt]"],
    ["model=llama-1b", "precision=bf16", "parallelism=zero3", "parallelism.micro_batch=2"],
    [
        "data=text",
        "data.path=/corpus",
        "data.tokenizer=/tok",
        "data.text_key=body",
        "tracking.uri=http://h:1",
    ],
    ["train.seed=7", "+train.steps=3"],  # '+' on a key that exists: refused (full path)
    ["train.lr=${train.seed}"],  # an interpolation (full path)
]
FAST_PATH_ERRORS = [
    ["train.seed=abc"],  # a type error
    ["train.steps=0"],  # a value the schema's __post_init__ refuses
    ["train.no_such_key=1"],
    ["method=lora", "method.target_modules=[1,{a:1}]"],
]


def _full_path(overrides: list[str]) -> tuple[object, str]:
    from omegaconf import OmegaConf

    from pipeline.config.compose import Composer, as_built, to_typed, to_yaml

    dcfg = Composer().compose(overrides)
    cfg = to_typed(dcfg, overrides)
    tree = OmegaConf.to_container(dcfg, resolve=True)
    as_built(cfg, tree, overrides)  # the model as built, the ranks per node the partition filled
    return cfg, to_yaml(OmegaConf.create(tree))


@pytest.mark.parametrize("overrides", FAST_PATH_POINTS + FAST_PATH_ERRORS, ids=lambda o: " ".join(o)[:40])
def test_the_fast_composition_path_equals_hydras(overrides: list[str]) -> None:
    """A sweep composes its points through Composer.point, which puts checked values into a
    resolved base instead of composing each point; its config, YAML and errors are the full
    path's (the same composer twice: the second point runs on a used scratch copy)."""
    from pipeline.config.compose import Composer, hydra_context

    with hydra_context():
        try:
            expected: tuple[object, str] | str = _full_path(overrides)
        except ConfigError as e:
            expected = str(e)
        composer = Composer()
        composer.point(0, ["model=tiny", "train.seed=1", "train.lr=0.5", "method.target_modules=[a]"])
        for _ in range(2):
            try:
                p = composer.point(1, overrides)
                got: tuple[object, str] | str = (p.cfg, p.yaml)
            except ConfigError as e:
                got = str(e)
            assert got == expected


def test_plain_value_overrides_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The points above that set scalars and lists never reach the per-point Hydra path."""
    from pipeline.config.compose import Composer, hydra_context

    with hydra_context():
        composer = Composer()
        for overrides in FAST_PATH_POINTS[:6]:
            composer.point(0, overrides)  # the bases, composed
        monkeypatch.setattr(composer, "compose", lambda overrides: pytest.fail(f"full path for {overrides}"))
        for overrides in FAST_PATH_POINTS[:6]:
            composer.point(0, overrides)


HYDRA_VALUE_CASES = [
    ["train.seed=7", "train.lr=0.5", "train.steps=30"],
    ["method.target_modules=[q_proj,v_proj]", "partition.setup=['module load cuda','a b']"],
    ["tracking.uri=null", "train.comm_sizes_mb=[2.0,8.0]", "++train.steps=9"],
    ["health.busbw_min_gbps={h100x8: 400.0}", "drill.loss_tolerance=1e-6"],
]


@pytest.mark.parametrize("values", HYDRA_VALUE_CASES, ids=lambda v: " ".join(v)[:40])
def test_the_private_hydra_call_composes_as_hydra_does(values: list[str]) -> None:
    """compose.apply_overrides is the one use of a private Hydra API (the cached bases of a sweep
    get each point's values through it). Against Hydra's public compose of the same overrides:
    a Hydra release that changes what it does, or its signature, fails here."""
    import copy
    import inspect

    from hydra import compose as hydra_compose
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    from pipeline.config.compose import apply_overrides, hydra_context, parse_override

    assert list(inspect.signature(ConfigLoaderImpl._apply_overrides_to_config).parameters) == [
        "overrides",
        "cfg",
    ]
    with hydra_context():
        base = hydra_compose(config_name="config", overrides=["method=lora"])
        ours = copy.deepcopy(base)
        apply_overrides(ours, [parse_override(v) for v in values])
        theirs = hydra_compose(config_name="config", overrides=["method=lora", *values])
        assert OmegaConf.to_container(ours) == OmegaConf.to_container(theirs)
        assert OmegaConf.to_container(ours) != OmegaConf.to_container(base)  # the values took


def test_only_the_adapter_reaches_into_hydra_internals() -> None:
    repo = Path(__file__).resolve().parents[2]
    uses = [
        f"{p.relative_to(repo)}:{i}"
        for d in ("pipeline", "analysis", "benchmarks")
        for p in sorted((repo / d).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "_internal" in line and "hydra" in line
    ]
    assert uses == ["pipeline/config/compose.py:25"], uses  # the import apply_overrides uses
