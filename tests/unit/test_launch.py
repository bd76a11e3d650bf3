"""`qualify launch` (docs/design.md, "Launch"): the files written from a candidate's evidence,
their values against hand computations, the job's own config, what reaches job.sbatch, and the
refusals (exit 2, one paragraph, nothing written)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from analysis import launch as AL
from pipeline.cli import main
from pipeline.config.dsconfig import ds_config
from pipeline.config.resolved import config_from_yaml
from pipeline.config.schema import Config
from pipeline.contract.spec import JobSpec
from pipeline.contract.sweepdir import Manifest, PointEntry, SweepDir
from pipeline.files import write_atomic
from pipeline.job.production import smoke_report
from pipeline.measure.launch import LaunchEvidence, Sourced
from pipeline.measure.projection import Projection
from pipeline.submit import launch as SL
from tests.support.analysis_helpers import H100_A, L40S_7B, fake_specs, make_fake_sweep

SWEEP = "20261206-010000-ab12"
CAND = "a100/tiny/full/fp32/zero2-1x2-mb4-ga1"


def _sweep(home: Path, **partition: object) -> None:
    """A sweep folder with one point whose resolved config is the schema's default on a
    partition with MaxTime 60 min (2 ranks a node, micro-batch 4, model.seq_len 64)."""
    data = OmegaConf.to_container(OmegaConf.structured(Config()))
    data["partition"].update(name="ci_a100", slurm_partition="a100", max_time_min=60, **partition)  # type: ignore[index]
    sd = SweepDir(home / "runs" / SWEEP)
    point = sd.point("p0000")
    point.path.mkdir(parents=True)
    write_atomic(point.config, OmegaConf.to_yaml(OmegaConf.create(data)))
    entry = PointEntry("p0000", 0, [], CAND, "ci_a100", "none", str(point.path), "fits")
    Manifest(SWEEP, "x", "t", "slurm", "sqlite:///db", "e", [], "parent1", points=[entry]).write(sd.path)


def _evidence(**kw: object) -> LaunchEvidence:
    base: dict = dict(
        sweep_id=SWEEP,
        candidate=CAND,
        run_id="run1",
        point_id="p0000",
        accepted_runs=("run1",),
        parent_run_id="parent1",
        gpus=4,
        tokens=1e6,
        steps=None,
        global_batch=32,
        smoke_steps=None,
        inputs={
            "tokens_per_s_per_gpu": (1000.0, "measured"),
            "ckpt_stall_s": (2.0, "measured"),
            "restart_s": (30.0, "measured"),
            "start_s": (20.0, "measured"),
            "interruptions_per_gpu_hour": (0.01, "assumed"),
        },
        interval_s=600.0,
        wall_s=(300.0, 310.0, 330.0),
        cost_usd=(1.0, 1.1, 1.2),
        cost_band=(0.9, 1.3),
        price=1.2,
        proven_micro_batch=Sourced(4.0, "searched in run run1"),
        stop_save_s=Sourced(4.0, "measured in run run1"),
        qualified_step_s=Sourced(0.5, "measured in run run1"),
        qualified_gpus=2,
        qualified_global_batch=8,
    )
    return LaunchEvidence(**{**base, **kw})


def test_the_files_and_their_derived_values(tmp_path: Path) -> None:
    _sweep(tmp_path)
    folder = SL.write_files(_evidence(), tmp_path / "runs")
    assert folder == tmp_path / "runs" / SWEEP / "launch" / "a100_tiny_full_fp32_zero2-1x2-mb4-ga1"
    cfg = config_from_yaml((folder / "train.yaml").read_text())
    # global batch 32 on 4 GPUs, micro-batch 4 proven: 32 / (4 x 4) = 2 micro-steps
    assert (cfg.parallelism.micro_batch, cfg.parallelism.grad_accum) == (4, 2)
    assert (cfg.parallelism.nodes, cfg.parallelism.per_node) == (2, 2)  # 4 GPUs, 2 ranks a node
    # 1e6 tokens / (32 x 64) = 488.3 -> 489 steps
    assert cfg.train.steps == 489
    # step time 32 x 64 / (1000 x 4) = 0.512 s; Young 600 s / 0.512 = 1171.9 -> capped at 489:
    # one checkpoint at the end (checkpoint_interval 0)
    assert cfg.train.checkpoint_interval == 0
    assert not cfg.search.micro_batch and cfg.drill == Config().drill
    ds = json.loads((folder / "ds_config.json").read_text())
    assert ds == ds_config(cfg.parallelism, cfg.precision, cfg.train, cfg.partition.is_gpu)
    assert ds["train_batch_size"] == 32 and ds["gradient_accumulation_steps"] == 2
    script = (folder / "job.sbatch").read_text()
    # grace 2 x (0.512 + 4) = 9.02 s -> 60 s; --time (310 x 1.2 + 60) / 60 = 7.2 -> 8 min
    assert "#SBATCH --signal=USR2@60" in script and "#SBATCH --time=8" in script
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    assert "#SBATCH --partition=a100" in script and "#SBATCH --requeue" in script
    assert f"-m pipeline.job.production {folder}" in script
    assert (
        f"#SBATCH --output={folder}/logs/%j.out" in script and (folder / "logs").is_dir()
    )  # Slurm makes no folder
    spec = JobSpec(**json.loads((folder / "spec.json").read_text()))
    assert (spec.kind, spec.parent_run_id, spec.point_dir) == ("production", "parent1", str(folder / "run"))
    why = (folder / "WHY.md").read_text()
    assert "searched in run run1" in why and "What would invalidate them" in why


def test_a_run_past_max_time_is_a_chain(tmp_path: Path) -> None:
    _sweep(tmp_path)
    # 10 h projected: 36000 x 1.2 = 43200 s; MaxTime 60 min, grace 60 s: 3540 s train each,
    # later ones restart for 30 s: 1 + ceil((43200 - 3540) / 3510) = 1 + 12 = 13 allocations
    folder = SL.write_files(_evidence(wall_s=(35000.0, 36000.0, 38000.0), tokens=1e8), tmp_path / "runs")
    script = (folder / "job.sbatch").read_text()
    assert "#SBATCH --time=60" in script and "a chain of 13 allocations" in script
    assert config_from_yaml((folder / "train.yaml").read_text()).launcher.max_restarts >= 12


def test_a_smoke_run_caps_steps_and_nodes_and_saves_mid_run(tmp_path: Path) -> None:
    _sweep(tmp_path)
    folder = SL.write_files(_evidence(gpus=16, global_batch=128, smoke_steps=20), tmp_path / "runs")
    cfg = config_from_yaml((folder / "train.yaml").read_text())
    assert cfg.train.steps == 20 and cfg.parallelism.nodes == 2  # 16 GPUs capped at 2 nodes of 2
    assert cfg.train.checkpoint_interval == 10  # half the smoke run: it measures an interval save
    spec = json.loads((folder / "spec.json").read_text())
    assert spec["point_dir"].endswith("/smoke")


def test_the_smoke_report_compares_with_the_projection() -> None:
    launch = {
        "evidence": {"candidate": CAND, "inputs": {"ckpt_stall_s": [2.0, "measured"]}},
        "derived": {"step_s": 0.5, "steps": 20, "nodes": 1, "per_node": 1},
    }
    ok = smoke_report(
        launch, {"outcome": "accepted", "metrics": {"perf/step_time_p50_s": 0.55, "ckpt/stall_s": 1.0}}
    )
    assert "| step time (s) | 0.5 | 0.55 | 1.100 | yes |" in ok and "inputs hold" in ok
    slow = smoke_report(launch, {"outcome": "accepted", "metrics": {"perf/step_time_p50_s": 0.7}})
    assert "| step time (s) | 0.5 | 0.7 | 1.400 | NO |" in slow and "not measured" in slow
    assert "do NOT all hold" in slow


def test_unreachable_global_batch_is_refused_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _sweep(tmp_path)
    assert SL.write_launch(_evidence(global_batch=30), tmp_path / "runs") == 2
    err = capsys.readouterr().err
    assert "project.global_batch=30 is not reachable on 4 GPUs with micro-batch 4" in err
    assert err.count("\n") == 1 and not (tmp_path / "runs" / SWEEP / "launch").exists()


@pytest.mark.parametrize(
    "field,value",
    [("account", "x; rm -rf ~"), ("qos", "$(touch /tmp/pwned)"), ("constraint", "a`id`"), ("account", "a b")],
)
def test_no_value_reaches_the_script_as_code(tmp_path: Path, field: str, value: str) -> None:
    _sweep(tmp_path, **{field: value})  # a config edited by hand after the sweep: refused on reading
    assert SL.write_launch(_evidence(), tmp_path / "runs") == 2
    assert not (tmp_path / "runs" / SWEEP / "launch").exists()


def test_a_path_with_a_blank_or_a_dollar_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "my $HOME"
    _sweep(home)
    with pytest.raises(SL.LaunchRefused, match="cannot be written into job.sbatch"):
        SL.write_files(_evidence(), home / "runs")
    assert not (home / "runs" / SWEEP / "launch").exists()


def test_the_srun_line_quotes_its_words(tmp_path: Path) -> None:
    _sweep(tmp_path)
    folder = SL.write_files(_evidence(), tmp_path / "runs")
    last = (folder / "job.sbatch").read_text().splitlines()[-1]
    words = shlex.split(last)
    assert words[:2] == ["srun", "--unbuffered"] and words[-3:] == [
        "-m",
        "pipeline.job.production",
        str(folder),
    ]


def test_cli_values_are_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (
        ["project.gpus=$(touch pwned)", "project.tokens=1e9"],
        ["project.gpus=4", "project.global_batch=`id`"],
    ):
        assert main(["launch", *args]) == 2
    assert "must be" in capsys.readouterr().err and not (tmp_path / "pwned").exists()


def test_a_candidate_without_an_accepted_run_is_refused(
    sqlite_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = ("h100-a-1", "h100-a-2", "l40s-7b-1", "a100-1b-1")  # two models, a candidate that never passed
    sweep = make_fake_sweep(sqlite_uri, specs={k: v for k, v in fake_specs().items() if k in keep})
    written: list[LaunchEvidence] = []

    def write(ev: LaunchEvidence, runs_dir: Path | None) -> int:
        written.append(ev)
        return 0

    base = ["--tracking-uri", sqlite_uri, "--sweep", sweep.sweep_id, "project.tokens=1e9", "project.gpus=8"]
    assert AL.launch_main([*base, "--candidate", L40S_7B], write) == 2
    assert "has no accepted run" in capsys.readouterr().err
    assert AL.launch_main(base, write) == 2  # two models, two winners: which one?
    assert "name the one to launch with --candidate" in capsys.readouterr().err
    assert AL.launch_main([*base, "project.gpus=4096", "--candidate", H100_A], write) == 2
    assert "outside what its runs support" in capsys.readouterr().err
    assert not written
    assert AL.launch_main([*base, "--candidate", H100_A], write) == 0
    (ev,) = written
    assert ev.candidate == H100_A and ev.run_id in ev.accepted_runs and ev.gpus == 8
    assert ev.inputs["tokens_per_s_per_gpu"][0] > 0 and ev.wall_s[0] <= ev.wall_s[1] <= ev.wall_s[2]


def _projection(inputs: dict[str, tuple[float, str]]) -> AL.CandidateProjection:
    mid = Projection(0.0, 3600.0, 36000.0, 0.95, 640.0, 1200.0)
    return AL.CandidateProjection("c", inputs=inputs, band=(mid, mid, mid))


def test_the_launch_refuses_what_the_scaling_series_refuses() -> None:
    """A series the projection will not extrapolate (analysis/series.py) refuses the launch with
    its reason; without a series, a target past 16x the largest size measured is refused; a
    series that supports the target is not held to the 16x."""
    refused = _projection({"do_not_extrapolate_beyond_gpus": (4.0, "compute per rank changed +245%")})
    why = AL.series_supports(refused, 8, [4])
    assert "at most 4 GPUs" in why and "+245%" in why
    assert "16x" in AL.series_supports(_projection({}), 65, [4])
    assert AL.series_supports(_projection({}), 64, [4]) == ""
    assert AL.series_supports(_projection({"scaling_measured": (2.0, "measured: 1x2, 2x2")}), 256, [4]) == ""


def test_a_partition_with_an_image_launches_its_ranks_in_it(tmp_path: Path) -> None:
    """The production job runs where the sweep ran the candidate: in the partition's image
    (pipeline.slurm.container). Apptainer replaces the interpreter on the srun line, the batch
    shell (on the host) keeps the requeue request's EXIT trap, and the project's trainer is what
    runs inside."""
    sif = tmp_path / "img.sif"
    sif.write_bytes(b"not a real image: only hashed")
    _sweep(tmp_path, container={"kind": "apptainer", "image": str(sif), "python": "/opt/venv/bin/python"})
    folder = SL.write_files(_evidence(), tmp_path / "runs")
    text = (folder / "job.sbatch").read_text()
    words = shlex.split(text.splitlines()[-1])
    assert words[:4] == ["srun", "--unbuffered", "apptainer", "exec"]
    assert words[words.index(str(sif)) + 1 :] == [
        "/opt/venv/bin/python",
        "-m",
        "pipeline.job.production",
        str(folder),
    ]
    assert "scontrol requeue" in text and "trap " in text and "EXIT" in text
    assert f"SQ_CONTAINER=apptainer:{sif}" in text
