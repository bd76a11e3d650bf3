"""What the runner observes around the fine-tune, in one place so the runner only calls it:
the pre-flight node health gate (pipeline.job.health), the telemetry sampler of each node
(pipeline.job.telemetry) and the straggler measurement and drill (pipeline.job.straggler).
Every method that gathers is called on every rank at the same point."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import torch.distributed as dist

from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.records import AttemptRecord
from pipeline.contract.spec import PointEnd
from pipeline.job.commsplit import step_metrics
from pipeline.job.health import (
    FAILED,
    NodeHealth,
    busbw_threshold,
    check_busbw,
    check_matmul,
    dcgm_diag,
    nvml_checks,
    worst,
)
from pipeline.job.straggler import StragglerDrill, StragglerMonitor
from pipeline.job.telemetry import NodeTelemetry, Sampler, energy_totals, node_name
from pipeline.measure.cost import energy_cost, kwh
from pipeline.tracking import keys as K
from pipeline.train.commtimer import StepCommTimer

# the job log's components of their own: `[health] ...`, `[straggler] ...`
health_log = logging.getLogger("pipeline.health")
straggler_log = logging.getLogger("pipeline.straggler")


def _gather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class Observer:
    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.cfg, self.renv, self.recorder = ctx.cfg, ctx.renv, ctx.recorder
        self.node = node_name()
        self.sampler: Sampler | None = None
        self.monitor: StragglerMonitor | None = None
        self.telemetry: list[NodeTelemetry] = []
        self.unhealthy: list[str] = []
        self.comm_timer: StepCommTimer | None = None

    # --- the gate ------------------------------------------------------------------------
    def gate(self, device: str, ceiling_tflops: float | None, busbw_gbps: float | None) -> PointEnd | None:
        """Every node's verdict (one all_gather); an outcome when a node failed."""
        cfg, renv = self.cfg, self.renv
        if not cfg.health.enabled:
            return None
        t0 = time.perf_counter()
        mine: NodeHealth | None = None
        if renv.local_rank == 0:
            mine = NodeHealth(self.node)
            nvml_checks(mine)
            if cfg.health.dcgm:
                dcgm_diag(mine)
        ranks = _gather((self.node, ceiling_tflops, mine))
        nodes: dict[str, NodeHealth] = {}
        for node, _, health in ranks:
            nodes.setdefault(node, health or NodeHealth(node))
            if health is not None:
                nodes[node] = health
        for node, h in nodes.items():
            if device == "cuda":
                check_matmul(h, [c for n, c, _ in ranks if n == node and c], cfg.health.matmul_spread_max)
            part = cfg.partition
            what = f"{part.gpu_type} x{cfg.parallelism.gpus_per_node}"
            if device != "cuda":
                h.notes.append(f"all-reduce threshold: not applied to CPU ranks ({what})")
            elif cfg.parallelism.nodes == 1:
                thr = busbw_threshold(cfg.health.busbw_min_gbps, part.gpu_type, cfg.parallelism.gpus_per_node)
                check_busbw(h, busbw_gbps, thr, what)
            else:
                h.notes.append("all-reduce threshold: per node only; this job spans nodes")
        verdict = worst([h.verdict for h in nodes.values()])
        self.unhealthy = sorted(n for n, h in nodes.items() if h.verdict == FAILED)
        spreads = [h.matmul_spread for h in nodes.values() if h.matmul_spread is not None]
        notes = sorted({f"{h.node}: {n}" for h in nodes.values() for n in h.notes})
        self.recorder.tags(
            {
                K.TAG_HEALTH: verdict,
                **{f"{K.TAG_HEALTH_NODE_PREFIX}{n}": h.line()[:4000] for n, h in nodes.items()},
                **({K.TAG_HEALTH_NOTES: "; ".join(notes)[:4000]} if notes else {}),
                **({K.TAG_UNHEALTHY_NODES: ",".join(self.unhealthy)} if self.unhealthy else {}),
            }
        )
        self.recorder.log(
            {
                K.HEALTH_SECONDS: time.perf_counter() - t0,
                **({K.HEALTH_MATMUL_SPREAD: max(spreads)} if spreads else {}),
            }
        )
        if renv.is_main:
            for n, h in nodes.items():
                health_log.info("%s: %s", n, h.line())
            for note in notes:
                health_log.info("%s", note)
        if not self.unhealthy:
            return None
        detail = "; ".join(f"node {n}: {'; '.join(nodes[n].failures)}" for n in self.unhealthy)
        return PointEnd(Outcome.FAILED, Reason.NODE_UNHEALTHY, detail)

    # --- during the fine-tune --------------------------------------------------------------
    def start_telemetry(self) -> None:
        if self.cfg.telemetry.enabled and self.renv.local_rank == 0:
            self.sampler = Sampler(self.cfg.telemetry.interval_s, self.node).start()

    def step_hooks(self, device: str) -> list[Any]:
        if self.renv.world_size < 2:
            return []
        self.monitor = StragglerMonitor(
            self.cfg.telemetry.straggler_interval, self.cfg.train.warmup_steps, self.renv.world_size, device
        )
        self.comm_timer = StepCommTimer(device, metrics=step_metrics)  # compute / communication / optimizer
        return [self.monitor, self.comm_timer]

    def in_step_hooks(self) -> list[Any]:
        drill = self.cfg.drill.straggler
        timer = [self.comm_timer] if self.comm_timer is not None else []
        if not drill.enabled:
            return timer
        return timer + [
            StragglerDrill(drill.rank, drill.fraction, self.renv.rank, self.cfg.train.warmup_steps)
        ]

    # --- after it ------------------------------------------------------------------------
    def finish(self, res: Any) -> dict[str, float]:
        """Stop the sampler, gather every node's telemetry and the ranks' forward times, log
        the samples and tags (rank 0); the straggler figures to log. Every rank calls it."""
        tel = self.sampler.stop() if self.sampler is not None else None
        self.sampler = None
        summary = self.monitor.finish() if self.monitor is not None else None
        gathered = _gather((self.node, tel))
        rank_nodes = [n for n, _ in gathered]
        self.telemetry = [t for _, t in gathered if t is not None]
        m: dict[str, float] = {}
        if summary is not None:
            m[K.PERF_STRAGGLER_SCORE] = summary.score
            for rank, median in enumerate(summary.medians_s):
                self.recorder.series({K.PERF_RANK_FORWARD_P50_S: median}, step=rank)
            self.recorder.tags(
                {
                    K.TAG_STRAGGLER_RANK: summary.slowest_rank,
                    K.TAG_STRAGGLER_NODE: rank_nodes[summary.slowest_rank],
                }
            )
            if self.renv.is_main:
                straggler_log.info(
                    "score %.3f: rank %s on %s is the slowest",
                    summary.score,
                    summary.slowest_rank,
                    rank_nodes[summary.slowest_rank],
                )
        for t in self.telemetry:
            for when, values in t.samples:
                self.recorder.series(values, step=int(when * 1000))
        return m

    def with_record(self, record: AttemptRecord) -> AttemptRecord:
        """The attempt record with this attempt's energy and the nodes that failed the gate."""
        totals = energy_totals(self.telemetry)
        rec = replace(record)
        if totals.gpu_j is not None:
            rec.gpu_energy_j, rec.gpus_metered = totals.gpu_j, totals.gpus
        if totals.host_j is not None:
            rec.host_energy_j = totals.host_j
        if self.telemetry:
            rec.energy_window_s = totals.window_s
        if self.unhealthy:
            rec.unhealthy_nodes = list(self.unhealthy)
        return rec

    def energy_metrics(self, attempts: list[AttemptRecord]) -> dict[str, float]:
        """Energy of every attempt (absent unless every attempt had the counter), this
        attempt's mean power per GPU, and the energy cost when a price is set."""
        m: dict[str, float] = {}
        this = attempts[-1]
        notes = []
        gpu_kwh = host_kwh = None
        if this.energy_window_s is None:
            notes.append("no telemetry (telemetry.enabled=false)")
        elif all(a.gpu_energy_j is not None for a in attempts):
            gpu_kwh = kwh(sum(a.gpu_energy_j or 0.0 for a in attempts))
            m[K.ENERGY_GPU_KWH] = gpu_kwh
        else:
            notes.append("GPU energy absent: no NVML energy counter in every attempt")
        if all(a.host_energy_j is not None for a in attempts):
            host_kwh = kwh(sum(a.host_energy_j or 0.0 for a in attempts))
            m[K.ENERGY_HOST_KWH] = host_kwh
        tel_notes = energy_totals(self.telemetry).notes
        notes.extend(n for n in tel_notes if "energy" in n)
        window = this.energy_window_s or 0.0
        if this.gpu_energy_j is not None and window > 0 and this.gpus_metered:
            m[K.ENERGY_GPU_MEAN_POWER_W] = this.gpu_energy_j / window / this.gpus_metered
        if window > 0:
            m[K.ENERGY_WINDOW_S] = window
        it_kwh = None if gpu_kwh is None else gpu_kwh + (host_kwh or 0.0)
        cost = energy_cost(it_kwh, self.cfg.cost.electricity_usd_per_kwh, self.cfg.cost.pue)
        if cost is not None:
            m[K.COST_ENERGY_USD] = cost
        if notes:
            self.recorder.tags({K.TAG_ENERGY_NOTE: "; ".join(notes)[:4000]})
        return m
