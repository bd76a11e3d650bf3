"""Issue 36, a cluster is named and recorded: the identity Slurm's `scontrol show config` gives
(ClusterName, SlurmctldHost[0], SLURM_VERSION), the local launcher's own, and how a planned
sweep carries it to its manifest, its parent run's tags and each point's spec."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from analysis.runs import RunRecord, Sweep
from analysis.workload import differences, workload
from pipeline.config.schema import ConfigError
from pipeline.data.tokenfile import open_token_file
from pipeline.sched import LOCAL, SLURM, ClusterIdentity
from pipeline.slurm import commands
from pipeline.slurm.cluster import parse_identity
from pipeline.submit import sweep as S
from pipeline.tracking import keys as K
from tests.support.recorded_slurm import RecordedSlurm

# `scontrol show config` of the local test cluster (Debian's 22.05), cut to a few lines around
# the ones read: the values below are read off this text by eye, not by the parser
SHOW_CONFIG_22_05 = """\
Configuration data as of 2026-12-04T03:07:32
AccountingStorageBackupHost = (null)
AuthInfo                = cred_expire=5
ClusterName             = sqlocal
MaxArraySize            = 1001
SlurmctldAddr           = (null)
SlurmctldHost[0]        = vm(127.0.0.1)
SlurmctldHost[1]        = vm-backup(127.0.0.2)
SlurmctldPort           = 6817
SLURM_CONF              = /work/main/.cluster/etc/slurm.conf
SLURM_VERSION           = 22.05.8
"""
# Slurm before 17.11 named the controller ControlMachine, and a host may come without address
SHOW_CONFIG_OLD = "ClusterName = gpu-east\nControlMachine = ctl01\nSLURM_VERSION = 17.02.11\n"


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> RecordedSlurm:
    recorded = RecordedSlurm()
    monkeypatch.setattr(commands, "execute", recorded)
    return recorded


def test_identity_from_scontrol_show_config(slurm: RecordedSlurm) -> None:
    slurm.answers["scontrol"] = SHOW_CONFIG_22_05
    assert SLURM.identity() == ClusterIdentity("sqlocal", "vm", "22.05.8")
    assert slurm.calls == [["scontrol", "show", "config"]], "one call"
    assert parse_identity(SHOW_CONFIG_OLD.splitlines()) == ClusterIdentity("gpu-east", "ctl01", "17.02.11")


def test_an_unreadable_identity_is_bad_input_before_submission(slurm: RecordedSlurm) -> None:
    slurm.answers["scontrol"] = "SlurmctldPort = 6817\n"
    with pytest.raises(ConfigError, match="ClusterName"):
        SLURM.identity()
    slurm.hangs.add("scontrol")
    with pytest.raises(ConfigError, match="nothing was submitted"):
        SLURM.identity()


def test_the_local_launcher_is_this_host() -> None:
    host = os.uname().nodename  # the kernel's name for this machine, not socket's
    assert LOCAL.identity() == ClusterIdentity(f"local-{host}", host, "none")


def test_cluster_tags_name_each_part() -> None:
    ident = asdict(ClusterIdentity("sqlocal", "vm", "22.05.8"))
    assert K.cluster_tags(ident) == {
        "sq.cluster": "sqlocal",
        "sq.cluster_controller": "vm",
        "sq.cluster_slurm_version": "22.05.8",
    }
    assert K.cluster_tags({}) == {}, "a manifest written before clusters were recorded"


def test_a_planned_sweep_carries_its_cluster_to_the_manifest_and_each_spec(tmp_path: Path) -> None:
    pl = S.plan("smoke", ["precision=fp32,bf16", f"runs_dir={tmp_path}"], launcher_kind="local")
    host = os.uname().nodename
    want = {"name": f"local-{host}", "controller": host, "slurm_version": "none"}
    assert pl.manifest.cluster == want
    for p, entry in zip(pl.points, pl.manifest.points, strict=True):
        assert S.spec_for(pl, p, entry).cluster == want
    pl.manifest.write(tmp_path)
    assert S.Manifest.read(tmp_path).cluster == want, "written and read back"


# --- the workload two clusters' sweeps must share (analysis/workload.py) ------------------------


def _run(tags: dict[str, str], params: dict[str, str], metrics: dict[str, float]) -> RunRecord:
    return RunRecord("r", "r", "FINISHED", 0, tags, params, metrics)


def _sweep(sweep_id: str, *runs: RunRecord) -> Sweep:
    return Sweep(sweep_id, "1", _run({}, {}, {}), list(runs))


SHAPE = {"model.name": "llama-7b", "model.n_layers": "32", "model.hidden": "4096", "model.seq_len": "4096"}
DONE = {K.TRAIN_TOKENS: 20 * 16384.0, K.TRAIN_STEPS: 20.0}


def test_sweeps_of_one_workload_on_two_clusters_agree() -> None:
    here = {**SHAPE, "model.pretrained": "/site-a/llama", "data.kind": "tokens"}
    there = {**SHAPE, "model.pretrained": "/site-b/llama", "data.kind": "tokens"}  # another path: same model
    fp = {K.TAG_DATA_FINGERPRINT: "uint16:1000:abcd"}
    assert differences([_sweep("a", _run(fp, here, DONE)), _sweep("b", _run(fp, there, DONE))]) == []
    assert workload(_sweep("a", _run(fp, here, DONE)))["tokens per step"] == {"16384"}  # 327680 / 20


@pytest.mark.parametrize(
    ("change", "part"),
    [
        ({"params": {"model.n_layers": "16"}}, "model config"),
        ({"tags": {K.TAG_METHOD: "lora"}}, "method"),
        ({"params": {"method.r": "8"}}, "method"),
        ({"tags": {K.TAG_DATA_FINGERPRINT: "uint16:1000:ffff"}}, "data"),
        ({"params": {"model.seq_len": "2048"}}, "seq_len"),
        ({"metrics": {K.TRAIN_TOKENS: 20 * 32768.0}}, "tokens per step"),
    ],
)
def test_each_part_of_the_workload_is_named_when_it_differs(change: dict[str, dict], part: str) -> None:
    base = ({K.TAG_DATA_FINGERPRINT: "uint16:1000:abcd"}, SHAPE, DONE)
    other = tuple(
        {**d, **change.get(k, {})} for d, k in zip(base, ("tags", "params", "metrics"), strict=True)
    )
    said = differences([_sweep("a", _run(*base)), _sweep("b", _run(*other))])
    assert len(said) == 1 and said[0].startswith(f"{part}: a has "), said


def test_the_token_file_fingerprint_is_its_content_not_its_path(tmp_path: Path) -> None:
    small = np.arange(1000, dtype=np.uint16)
    (tmp_path / "a.bin").write_bytes(small.tobytes())
    fp = open_token_file(tmp_path / "a.bin", "uint16", 0.1).fingerprint()
    want = hashlib.sha256(b"uint16:1000" + small.tobytes()).hexdigest()[:16]  # small: the whole file
    assert fp == f"uint16:1000:{want}"
    big = np.random.default_rng(0).integers(0, 50000, size=8 << 20, dtype=np.uint16)  # 16 MiB
    for name in ("x.bin", "y.bin"):
        (tmp_path / name).write_bytes(big.tobytes())
    x, y = (open_token_file(tmp_path / n, "uint16", 0.1).fingerprint() for n in ("x.bin", "y.bin"))
    assert x == y, "a copy elsewhere is the same data"
    big[-1] ^= 1  # the last token: in the last sampled block
    (tmp_path / "y.bin").write_bytes(big.tobytes())
    assert open_token_file(tmp_path / "y.bin", "uint16", 0.1).fingerprint() != x
