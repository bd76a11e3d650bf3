"""Ranks inside an image on the local Slurm (cluster/cluster.sh: oci.conf, crun, the bundle that
cluster/oci_bundle.sh builds from the host's folders).

- Slurm's own OCI support: the acceptance point (partition=ci_oci drill=preempt, 2 nodes x 1
  rank, since Slurm 22.05 runs one task per node in a container step) runs inside the bundle to
  `accepted` with the preempt drill's evidence (a USR2 to the ranks, the requeue run by the
  batch shell on the host, the resumed attempt); `sq.container` names the kind and the bundle,
  and every rank's mount namespace differs from the host's: the test fails if they ran on the host.
- Apptainer without Apptainer: a stand-in `apptainer` on PATH (tests/support/apptainer_standin.py)
  runs the interpreter submitit was given through crun, so the Apptainer launch path runs end to
  end: one rank, no drill.

Measured here (2 cores, load average about 6 from other work): the OCI test 79 s (its
reference run and two attempts), the Apptainer test 20 s; beside other helpers' jobs (load
about 12) 190 s and 101 s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from pipeline.contract.outcome import Outcome
from pipeline.tracking import keys as K
from tests.support.slurm_sweep import JOB_WAIT_S, ONE_RANK, REPO, TINY, point_runs, qualify, sweep_id_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _need_crun() -> None:
    if shutil.which("crun") is None:
        msg = "crun is not installed: bash cluster/cluster.sh install"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def _ran_inside(tags: dict[str, str], ranks: int) -> None:
    """Every rank's mount namespace is its own, not the host's (the batch shell's)."""
    host = tags[K.TAG_CONTAINER_HOST_MNTNS]
    entries = tags[K.TAG_CONTAINER_MNTNS].split()
    assert len(entries) == ranks, entries
    for entry in entries:
        mnt = entry.split(":")[2] + ":" + entry.split(":")[3]  # "<rank>:<host>:mnt:[n]:pid:[n]:pid<k>"
        assert mnt.startswith("mnt:[") and mnt != host, (entry, host)
    assert tags[K.TAG_CONTAINER_INSIDE] == "yes"


@pytest.mark.long(79)
@pytest.mark.timeout(600)
def test_oci_preempt_point_runs_inside_the_bundle(tmp_path: Path, slurm_cluster: None) -> None:
    _need_crun()
    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path}/mlruns.db"
    out = qualify(
        "sweep", "--sweep", "default", "--wait",
        "partition=ci_oci", "drill=preempt", "model=tiny", "precision=fp32", "parallelism=zero2",
        *TINY, "drill.preempt.at_step=4", f"runs_dir={runs}", f"tracking.uri={uri}",
        timeout=JOB_WAIT_S * 2,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    sweep_id = sweep_id_of(out.stdout)
    (run,) = point_runs(uri, "slurm-qualify", sweep_id)
    tags = run.data.tags
    assert tags[K.TAG_OUTCOME] == Outcome.ACCEPTED, tags.get(K.TAG_REASON_DETAIL)
    bundle = Path(os.environ.get("SQ_CLUSTER_DIR", REPO / ".cluster")) / "oci" / "bundle"
    assert tags[K.TAG_CONTAINER] == f"oci:{bundle}"
    digest = hashlib.sha256((bundle / "config.json").read_bytes()).hexdigest()
    assert tags[K.TAG_CONTAINER_DIGEST] == f"sha256:{digest}"
    _ran_inside(tags, ranks=2)
    # the drill's evidence: preempted, requeued, resumed in a second attempt
    assert tags[K.TAG_RESTART_REASON] == "preempt" and tags[K.TAG_RESTARTS] == "1"
    logs = "".join(p.read_text() for p in (runs / sweep_id / "submitit").glob("*_log.out"))
    assert "batch shell: requeue asked from inside the image" in logs  # scontrol ran on the host
    for rank in (0, 1):  # the warning reached every rank through srun and crun
        assert f"rank {rank}: preempt at step" in logs, logs[-3000:]


@pytest.mark.long(20)
@pytest.mark.timeout(400)
def test_apptainer_path_runs_end_to_end_through_a_stand_in(tmp_path: Path, slurm_cluster: None) -> None:
    _need_crun()
    bin_dir, image, calls = tmp_path / "bin", tmp_path / "image.sif", tmp_path / "apptainer.calls"
    bin_dir.mkdir()
    standin = REPO / "tests" / "support" / "apptainer_standin.py"
    (bin_dir / "apptainer").write_text(f'#!/bin/sh\nexec /usr/bin/python3 {standin} "$@"\n')
    (bin_dir / "apptainer").chmod(0o755)
    image.write_bytes(b"a stand-in image\n")
    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path}/mlruns.db"
    env = {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SQ_APPTAINER_LOG": str(calls),
    }
    out = qualify(
        "sweep", "--sweep", "default", "--wait",
        "partition=ci_a100", ONE_RANK, "model=tiny", "precision=fp32", "parallelism=zero2", "drill=none",
        "partition.container.kind=apptainer", f"partition.container.image={image}",
        *TINY, f"runs_dir={runs}", f"tracking.uri={uri}",
        timeout=JOB_WAIT_S, env=env,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    (run,) = point_runs(uri, "slurm-qualify", sweep_id_of(out.stdout))
    tags = run.data.tags
    assert tags[K.TAG_OUTCOME] == Outcome.ACCEPTED, tags.get(K.TAG_REASON_DETAIL)
    assert tags[K.TAG_CONTAINER] == f"apptainer:{image}"
    assert tags[K.TAG_CONTAINER_DIGEST] == "sha256:" + hashlib.sha256(b"a stand-in image\n").hexdigest()
    _ran_inside(tags, ranks=1)
    call = calls.read_text().splitlines()[0]
    assert '"nv": true' in call and str(runs) in call  # --nv on a GPU partition; the runs bound in
