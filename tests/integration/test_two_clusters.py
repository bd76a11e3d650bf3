"""Issue 36 on real clusters: the two local Slurm clusters (cluster/cluster.sh up starts sqlocal
and sqlocal2, each with its own controller and a partition named h100), one sweep on each, both
tracking to one MLflow server (the project's PostgreSQL-backed server with auth, as a team runs
it). `qualify report --sweeps A,B` ranks the candidates of both clusters in one table, each run
naming the cluster Slurm says it ran on; a sweep of another model (run on the local launcher, the cheapest place) is refused by name.
Run: .venv/bin/python -m pytest tests/integration/test_two_clusters.py
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from pipeline.tracking import keys as K
from tests.support.helpers import NEEDS_POSTGRES, shared_server
from tests.support.slurm_sweep import (
    ONE_RANK,
    REPO,
    TINY,
    follow,
    manifest_of,
    point_runs,
    qualify,
    sweep_id_of,
)

FAST = [*TINY, "train.measure_comm=false", "partition=ci_h100", ONE_RANK]


def second_conf() -> str:
    """The second cluster's slurm.conf, as the cluster script states it."""
    out = subprocess.run(
        ["bash", str(REPO / "cluster" / "cluster.sh"), "env"],
        capture_output=True,
        text=True,
        env={**os.environ, "SQ_WHICH": "second"},
        timeout=10,
        check=True,
    ).stdout
    return out.strip().removeprefix("export SLURM_CONF=")


def _sweep(runs: Path, uri: str, env: dict[str, str], *extra: str) -> str:
    res = qualify(
        "sweep", "--sweep", "slurm_ci", f"runs_dir={runs}", f"tracking.uri={uri}", *FAST, *extra, env=env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    sweep_id = sweep_id_of(res.stdout)
    st = follow(sweep_id, runs, timeout=600, env=env)
    assert st.returncode == 0, st.stdout + st.stderr
    return sweep_id


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
@NEEDS_POSTGRES
def test_one_sweep_on_each_cluster_one_decision(
    tmp_path: Path, slurm_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = second_conf()
    assert Path(conf).is_file(), f"{conf}: cluster/cluster.sh up starts the second cluster"
    on_second = {"SLURM_CONF": conf}
    with shared_server(tmp_path, monkeypatch.setenv) as server:
        runs = tmp_path / "runs"
        a = _sweep(runs, server.url, {})
        b = _sweep(runs, server.url, on_second)
        # another model, where it costs least (the local launcher: a workload is a workload)
        res = qualify("sweep", "--sweep", "smoke", "--launcher", "local", "--wait", f"runs_dir={runs}",
                      f"tracking.uri={server.url}", *TINY, "model.hidden=96", timeout=600)  # fmt: skip
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        found = re.search(r"^sweep (\d{8}-\d{6}-[0-9a-f]+): ", res.stdout, re.M)  # the local launcher's line
        assert found, res.stdout[-3000:]
        other = found.group(1)

        # each run names the cluster Slurm says it ran on
        by_sweep = {sid: point_runs(server.url, "slurm-qualify", sid) for sid in (a, b, other)}
        assert {r.data.tags[K.TAG_CLUSTER] for r in by_sweep[a]} == {"sqlocal"}
        assert {r.data.tags[K.TAG_CLUSTER] for r in by_sweep[b]} == {"sqlocal2"}
        for sid, cluster in ((a, "sqlocal"), (b, "sqlocal2")):
            (point,) = manifest_of(runs / sid)["points"]
            job = point["job_id"].split("_", 1)[0]
            sacct = subprocess.run(
                ["sacct", "-X", "-n", "-P", "-M", cluster, "-j", job, "-o", "Cluster,Partition,State"],
                capture_output=True, text=True, timeout=30,
            ).stdout.split()  # fmt: skip
            assert sacct and sacct[0] == f"{cluster}|h100|COMPLETED", (sid, sacct)

        out = tmp_path / "report"
        rep = qualify("report", "--sweeps", f"{a},{b}", "--tracking-uri", server.url, "--out", str(out),
                      "--no-attach", "--no-tag-runs", timeout=300)  # fmt: skip
        assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
        md = (out / f"sweeps-{a}+{b}.md").read_text()
        table = md.split("## Candidates\n", 1)[1].split("\n## ", 1)[0]
        (cand,) = {r.data.tags[K.TAG_CANDIDATE] for r in by_sweep[a]}
        for cluster in ("sqlocal", "sqlocal2"):
            assert re.search(rf"^\| {re.escape(cluster)}/{re.escape(cand)} \|", table, re.M), table
        assert "sqlocal: prices dated" in md and "sqlocal2: prices dated" in md, md

        refused = qualify("report", "--sweeps", f"{a},{other}", "--tracking-uri", server.url,
                          "--out", str(tmp_path / "no"), timeout=300)  # fmt: skip
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "did not measure the same workload" in refused.stderr and "model config:" in refused.stderr
        assert not (tmp_path / "no").exists()
