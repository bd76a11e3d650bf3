"""Telemetry, energy, the node health gate and stragglers (pipeline/job/telemetry.py, health.py,
straggler.py), driven by a fake NVML (tests/support/fake_nvml.py) where the code needs a GPU, and by
real CPU ranks for the straggler drill. The gate inside a job, and the resubmission without a
failed node, run on the local Slurm: tests/integration/test_health_slurm.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import tests.support.fake_nvml as fake
from pipeline.contract.outcome import Outcome
from pipeline.job import health, telemetry
from pipeline.job.straggler import StragglerDrill, summarize
from pipeline.measure.cost import energy_cost, energy_per_accepted_output, kwh
from pipeline.tracking import keys as K
from tests.support.helpers import launch_ranks, point_runs, write_spec


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake NVML behind pipeline.contract.gpu.nvml(), 4 GPUs, on node 'n1'."""
    monkeypatch.setenv("SQ_NVML_MODULE", "tests.support.fake_nvml")
    monkeypatch.setenv("SQ_FAKE_NVML_GPUS", "4")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("SQ_FAKE_NVML_ECC_NODES", "SQ_FAKE_NVML_ECC_FILE", "SQ_FAKE_NVML_NO_ENERGY"):
        monkeypatch.delenv(name, raising=False)
    fake._S.initialised = 0
    return fake


# --- the fake keeps nvidia-ml-py's interface ------------------------------------------------


def test_fake_nvml_has_the_real_signatures() -> None:
    """Every function of the fake exists in nvidia-ml-py with the same required parameters."""

    import pynvml

    names = [n for n in dir(fake) if n.startswith("nvml") and callable(getattr(fake, n))]
    assert len(names) > 20
    for n in names:
        if n.startswith("nvmlClocks"):
            continue
        assert _required(getattr(pynvml, n)) == _required(getattr(fake, n)), n
    assert fake.NVMLError is pynvml.NVMLError


def _required(fn: Any) -> int:
    import inspect

    return sum(p.default is inspect.Parameter.empty for p in inspect.signature(fn).parameters.values())


# --- the sampler ---------------------------------------------------------------------------


def test_sampler_logs_the_jobs_gpus_and_energy_is_the_counter_difference(nvml: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")  # the job was given GPUs 1 and 3 of 4
    readings = iter(range(10**9, 2 * 10**9, 7_777))  # mJ, a counter that only grows
    seen: dict[int, list[int]] = {1: [], 3: []}

    def counter(h: Any) -> int:
        value = next(readings)
        seen[h.index].append(value)
        return value

    monkeypatch.setattr(fake, "nvmlDeviceGetTotalEnergyConsumption", counter)
    s = telemetry.Sampler(0.05, powercap=Path("/nonexistent")).start()
    time.sleep(0.3)
    tel = s.stop()
    assert len(tel.samples) >= 3
    keys = set().union(*(v for _, v in tel.samples))
    assert "sys/n1/gpu1/power_w" in keys and "sys/n1/gpu3/energy_j" not in keys
    assert not any(k.startswith(("sys/n1/gpu0/", "sys/n1/gpu2/")) for k in keys)
    for what in ("utilization_pct", "memory_used_gib", "temperature_c", "sm_clock_mhz", "throttle_reasons"):
        assert f"sys/n1/gpu3/{what}" in keys
    assert {"sys/n1/cpu_utilization_pct", "sys/n1/memory_used_gib"} <= keys
    assert tel.samples[0][1]["sys/n1/gpu3/power_w"] == 330.0  # 300 + 10 x index, W
    assert tel.gpu_energy_j == {i: (seen[i][-1] - seen[i][0]) / 1000 for i in (1, 3)}
    assert tel.host_energy_j is None and any("no RAPL counter" in n for n in tel.notes)


def test_no_energy_counter_is_absent_and_said(nvml: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SQ_FAKE_NVML_NO_ENERGY", "1")
    tel = telemetry.Sampler(0.05, powercap=Path("/nonexistent")).start().stop()
    assert tel.gpu_energy_j == {}
    assert "sys/n1/gpu0/power_w" in tel.samples[0][1]
    assert any("energy_counter absent: NVML NVMLError_NotSupported" in n for n in tel.notes)
    totals = telemetry.energy_totals([tel])
    assert totals.gpu_j is None and totals.host_j is None


def test_rapl_energy_with_wrap_around(tmp_path: Path) -> None:
    pkg = tmp_path / "intel-rapl:0"
    (tmp_path / "intel-rapl:0:0").mkdir(parents=True)  # a sub-domain: inside its package
    pkg.mkdir()
    (pkg / "max_energy_range_uj").write_text("1000000\n")
    (pkg / "energy_uj").write_text("900000\n")
    rapl = telemetry.Rapl(tmp_path)
    first = rapl.read()
    (pkg / "energy_uj").write_text("100000\n")  # wrapped: 100000 + 1000000 - 900000 uJ later
    assert first is not None and rapl.joules(first, rapl.read() or []) == pytest.approx(0.2)
    (pkg / "energy_uj").chmod(0)
    if not (pkg / "energy_uj").exists() or _readable(pkg / "energy_uj"):
        return  # root reads anything: the unreadable case cannot be staged here
    assert "not readable" in telemetry.Rapl(tmp_path).note


def _readable(p: Path) -> bool:
    try:
        p.read_text()
        return True
    except OSError:
        return False


# --- the gate ------------------------------------------------------------------------------


def test_gate_healthy_node(nvml: Any) -> None:
    h = health.NodeHealth("n1")
    health.nvml_checks(h)
    assert h.verdict == health.HEALTHY, h.line()
    assert any("retired pages: not supported" in n for n in h.notes)


def test_gate_fails_a_node_with_an_uncorrected_ecc_error(nvml: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SQ_FAKE_NVML_ECC_NODES", "n0,n1")
    h = health.NodeHealth("n1")
    health.nvml_checks(h)
    assert h.verdict == health.FAILED
    assert h.failures == ["GPU 0: 1 uncorrected ECC error(s) since the driver loaded"]


def test_gate_degrades_narrow_pcie_throttling_and_spread(nvml: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SQ_FAKE_NVML_PCIE_WIDTH", "8")
    monkeypatch.setattr(fake, "nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x1 | 0x40)  # hw thermal
    h = health.NodeHealth("n1")
    health.nvml_checks(h)
    health.check_matmul(h, [100.0, 99.0, 93.0, 100.0], 0.05)
    assert h.verdict == health.DEGRADED
    text = h.line()
    assert "PCIe link x8 of x16" in text and "reasons 0x41" in text and "spread 7.0%" in text
    ok = health.NodeHealth("n2")
    health.check_matmul(ok, [100.0, 97.0], 0.05)
    assert ok.verdict == health.HEALTHY and ok.matmul_spread == pytest.approx(0.03)


def test_busbw_threshold_is_data_with_its_source() -> None:
    from tests.support.helpers import compose

    cfg = compose()
    assert "azurehpc-health-checks" in cfg.health.busbw_source
    thr = health.busbw_threshold(cfg.health.busbw_min_gbps, "H100", 8)
    assert thr == 460.0 and health.busbw_threshold(cfg.health.busbw_min_gbps, "h200", 8) == 431.0
    h = health.NodeHealth("n1")
    health.check_busbw(h, 420.0, thr, "h100 x8")
    assert h.failures == ["all-reduce bus bandwidth 420 GB/s below 460 GB/s for h100 x8"]
    h2 = health.NodeHealth("n1")
    health.check_busbw(h2, None, health.busbw_threshold(cfg.health.busbw_min_gbps, "a100", 4), "a100 x4")
    assert h2.verdict == health.HEALTHY and h2.notes == ["all-reduce threshold: none for a100 x4"]


def test_dcgm_diag_json_is_parsed() -> None:
    out = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
                {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [{"status": "Fail"}]}]},
                {"category": "Integration", "tests": [{"name": "PCIe", "results": [{"status": "Warn"}]}]},
            ]
        }
    }
    assert health.parse_dcgm(json.dumps(out)) == (["GPU Memory"], ["PCIe"])


# --- stragglers and energy cost --------------------------------------------------------------


def test_straggler_score_names_the_slowest_rank() -> None:
    s = summarize([[1.0, 1.1, 0.9], [1.3, 1.3, 5.0], [1.0, 1.0, 1.0]])
    assert s is not None and s.slowest_rank == 1 and s.fastest_rank in (0, 2)
    assert s.score == pytest.approx(1.3)
    assert summarize([[1.0], []]) is None and summarize([[1.0]]) is None


def test_straggler_drill_pauses_its_rank_only(monkeypatch: Any) -> None:
    class T:
        class result:  # noqa: N801
            forward_times = {1: 0.010, 2: 0.012, 3: 0.011}

    slow = StragglerDrill(rank=1, fraction=0.5, this_rank=1, base_steps=3)
    other = StragglerDrill(rank=1, fraction=0.5, this_rank=0, base_steps=3)
    for step in (1, 2, 3):
        slow.in_step(T, step)
        assert slow.pause_s is None  # the base steps are not slowed
    t0 = time.perf_counter()
    slow.in_step(T, 4)
    assert slow.pause_s == pytest.approx(0.0055) and time.perf_counter() - t0 >= 0.0055
    other.in_step(T, 4)
    assert other.pause_s is None


def test_energy_cost_and_per_output() -> None:
    assert kwh(3.6e6) == 1.0
    assert energy_cost(10.0, 0.12, 1.3) == pytest.approx(1.56)
    assert energy_cost(None, 0.12, 1.3) is None and energy_cost(10.0, None, 1.3) is None
    assert energy_per_accepted_output(3.0, 2) == 1.5 and energy_per_accepted_output(3.0, 0) is None
    with pytest.raises(ValueError, match="pue"):
        energy_cost(1.0, 0.1, 0.9)


# --- real ranks -----------------------------------------------------------------------------

FAKE_ENV = {
    "SQ_NVML_MODULE": "tests.support.fake_nvml",
    "SQ_FAKE_NVML_GPUS": "2",
    "SLURMD_NODENAME": "fake-1",
}
# a forward of ~10 ms on a quiet core: long enough for a measurable pause
STRAGGLER_RUN = ["train.steps=30", "model.hidden=128", "model.seq_len=128", "telemetry.interval_s=0.5"]


def _run(tmp: Path, overrides: list[str], env: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    spec = write_spec(tmp, tmp / "point", overrides, uri)
    # cold, as srun starts them: the pace of two ranks is what these tests measure (forked from
    # the warm server, the pair without a drill scored 1.107 against 1.1 once, under CI's load)
    outs = launch_ranks(
        spec, 2, env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, warm=False
    )
    outcome = json.loads((tmp / "point" / "outcome.json").read_text())
    assert outcome, "\n".join(o.stdout[-3000:] for o in outs)
    (run,) = point_runs(uri)
    return run, outcome


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_straggler_drill_is_detected_with_telemetry_and_energy(tmp_path: Path) -> None:
    """drill=straggler slows rank 1 by 60%: the score is >= 1.2 and names rank 1 and its node (at
    the default 30% a CI loaded beside it measured 1.15: the slowed rank's spin takes a core from
    its peer too);
    every GPU of the job has telemetry, the energy is the counters' difference, and its cost
    carries the PUE (1.4 here: at 1.0 a dropped factor would pass)."""
    run, outcome = _run(
        tmp_path,
        [
            *STRAGGLER_RUN,
            "drill=straggler",
            "drill.straggler.fraction=0.6",
            "cost.electricity_usd_per_kwh=0.2",
            "cost.pue=1.4",
        ],
        FAKE_ENV,
    )
    assert outcome["outcome"] == Outcome.ACCEPTED, outcome
    m, tags = run.data.metrics, run.data.tags
    print(f"straggler score with the drill: {m[K.PERF_STRAGGLER_SCORE]:.3f}")
    assert m[K.PERF_STRAGGLER_SCORE] >= 1.2
    assert tags[K.TAG_STRAGGLER_RANK] == "1" and tags[K.TAG_STRAGGLER_NODE] == "fake-1"
    assert tags[K.TAG_HEALTH] == "healthy" and tags[f"{K.TAG_HEALTH_NODE_PREFIX}fake-1"] == "healthy"
    for key in ("sys/fake-1/gpu0/power_w", "sys/fake-1/gpu1/temperature_c", "sys/fake-1/cpu_utilization_pct"):
        assert key in m, key
    (attempt,) = json.loads((tmp_path / "point" / "attempts.json").read_text())
    window = attempt["energy_window_s"]
    # the fake's counters integrate 300 W and 310 W: their difference over the sampled window
    assert attempt["gpu_energy_j"] == pytest.approx((300 + 310) * window, rel=1e-3)
    assert m[K.ENERGY_GPU_KWH] == pytest.approx(attempt["gpu_energy_j"] / 3.6e6)
    assert m[K.ENERGY_GPU_MEAN_POWER_W] == pytest.approx(305, rel=1e-3)
    # by hand from the attempt record: J / 3.6e6 J per kWh x PUE 1.4 (the facility's overhead:
    # a bill without it is 1/1.4 of this) x $0.20 per kWh; no host counter here
    assert m[K.COST_ENERGY_USD] == pytest.approx(attempt["gpu_energy_j"] / 3.6e6 * 1.4 * 0.2, rel=1e-9)
    assert K.ENERGY_HOST_KWH not in m and "RAPL" in tags[K.TAG_ENERGY_NOTE]


@pytest.mark.slow
@pytest.mark.timed  # two ranks' equal pace, measured: at the machine's priority, not beside niced work
@pytest.mark.timeout(600)
def test_without_the_drill_the_ranks_score_below_1_1(tmp_path: Path) -> None:
    run, outcome = _run(tmp_path, [*STRAGGLER_RUN, "telemetry.enabled=false"], {})
    assert outcome["outcome"] == Outcome.ACCEPTED, outcome
    score = run.data.metrics[K.PERF_STRAGGLER_SCORE]
    print(f"straggler score without the drill: {score:.3f}")
    assert 1.0 <= score < 1.1
    assert not any(k.startswith("sys/") for k in run.data.metrics)  # telemetry off: nothing sampled
    assert "telemetry.enabled=false" in run.data.tags[K.TAG_ENERGY_NOTE]


def test_a_straggler_rank_outside_the_run_is_refused() -> None:
    from pipeline.config.schema import ConfigError
    from pipeline.config.validate import point_problems
    from tests.support.helpers import compose

    assert point_problems(compose(["drill=straggler", "drill.straggler.rank=2"])) == [
        "drill.straggler.rank=2 must be a rank of a run of 2 or more ranks (this run has 2): "
        "a straggler is slow against the others"
    ]
    assert point_problems(compose(["drill=straggler"])) == []
    with pytest.raises(ConfigError, match=r"Invalid value for 'drill.straggler.fraction': 0"):
        compose(["drill=straggler", "drill.straggler.fraction=0"])
