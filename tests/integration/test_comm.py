"""Bandwidth arithmetic by hand, and real collectives between two gloo processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.measure.comm import CommSample, algbw, buffer_elems, bus_factor, busbw, plateau

REPO = Path(__file__).resolve().parents[2]


def test_bus_factors_nccl_tests() -> None:
    # PERFORMANCE.md, 8 ranks: all_reduce 2*7/8 = 1.75; all_gather, reduce_scatter 7/8 = 0.875
    assert bus_factor(8, "all_reduce") == 1.75
    assert bus_factor(8, "all_gather") == 0.875
    assert bus_factor(8, "reduce_scatter") == 0.875
    assert bus_factor(8, "broadcast") == 1.0
    assert bus_factor(8, "reduce") == 1.0
    # One rank moves nothing over the bus.
    assert bus_factor(1, "all_reduce") == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor(8, "all_to_all")


def test_algbw_busbw() -> None:
    # 1 GiB all_reduce in 10 ms on 8 ranks: algbw 1,073,741,824 / 0.01 = 107,374,182,400 B/s
    # busbw * 1.75 = 187,904,819,200 B/s (187.9 GB/s)
    a = algbw(2**30, 0.01)
    assert a == pytest.approx(107_374_182_400)
    assert busbw(a, 8, "all_reduce") == pytest.approx(187_904_819_200)
    with pytest.raises(ValueError):
        algbw(1, 0.0)


def test_plateau_uses_large_sizes_only() -> None:
    # Largest 64 MiB -> sizes >= 16 MiB count. The 1 MiB point has the highest busbw (a cache
    # artefact, say) but is excluded; max over {16 MiB: 90, 64 MiB: 80} is 90.
    mib = 2**20
    results = [
        CommSample(1 * mib, 1.0, 0.0, 120.0),
        CommSample(4 * mib, 1.0, 0.0, 60.0),
        CommSample(16 * mib, 1.0, 0.0, 90.0),
        CommSample(64 * mib, 1.0, 0.0, 80.0),
    ]
    assert plateau(results) == 90.0
    assert plateau([(100, 1.0, 2.0, 3.0)]) == 3.0  # plain tuples work too
    assert plateau([]) is None


def test_buffer_sizes_follow_nccl_tests() -> None:
    # all_gather of 1 MiB float32 on 4 ranks: total output 262,144 elems, each rank sends 65,536.
    assert buffer_elems("all_gather", 2**20, 4, 4) == (65_536, 262_144)
    # reduce_scatter: size is the total input; each rank keeps a quarter.
    assert buffer_elems("reduce_scatter", 2**20, 4, 4) == (262_144, 65_536)
    assert buffer_elems("all_reduce", 2**20, 4, 4) == (262_144, 262_144)
    # 1000 bytes = 250 elems on 3 ranks: rounded down to 249 = 3 * 83.
    assert buffer_elems("all_gather", 1000, 3, 4) == (83, 249)
    # Tiny sizes still move one element per rank.
    assert buffer_elems("all_gather", 1, 2, 4) == (1, 2)


_WORKER = """
import json, sys
import torch.distributed as dist
from pipeline.train.probes import measure_collectives

dist.init_process_group("gloo")
res = measure_collectives(
    [4096, 65536, 1 << 20], iters=3, warmup=1,
    ops=("all_reduce", "all_gather", "reduce_scatter", "broadcast"),
)
json.dump({op: {"n": r.world_size, "samples": r.samples, "plateau": r.plateau_busbw}
           for op, r in res.items()}, open(sys.argv[1], "w"))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_measure_collectives_two_gloo_ranks(tmp_path: Path) -> None:
    # Ranks launched the way srun does: one process each, with the rendezvous in the environment.
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(REPO))
        cmd = [sys.executable, "-c", _WORKER, str(tmp_path / f"rank{rank}.json")]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env))
    for p in procs:
        assert p.wait(timeout=120) == 0
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0 == r1  # times are averaged over the ranks, so every rank reports the same
    # nccl-tests sizes: float32, 2 ranks, all of these divide evenly, so the sizes are exact.
    factors = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}
    for op, factor in factors.items():
        res = r0[op]
        assert res["n"] == 2
        sizes = [s[0] for s in res["samples"]]
        assert sizes == [4096, 65536, 1 << 20]
        for size, t, alg, bus in res["samples"]:
            assert t > 0
            assert alg == pytest.approx(size / t)
            assert bus == pytest.approx(alg * factor)
        # plateau over sizes >= 1 MiB / 4: only the 1 MiB point qualifies
        assert res["plateau"] == res["samples"][-1][3]
