"""Issue 36, a cluster is named and recorded: the identity Slurm's `scontrol show config` gives
(ClusterName, SlurmctldHost[0], SLURM_VERSION), the local launcher's own, and how a planned
sweep carries it to its manifest, its parent run's tags and each point's spec."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pytest

from pipeline.config.schema import ConfigError
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
