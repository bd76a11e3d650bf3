"""The master port every rank of a job derives alike (pipeline.job.distributed.port_for_job):
distinct for the jobs that run on one node at once, and outside the range the kernel hands to
outgoing connections (read from the kernel itself), where gloo's own sockets may hold it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.job.distributed import PORT_SPAN, port_for_job


def test_jobs_that_run_at_once_get_different_ports() -> None:
    """Slurm's allocation ids of jobs alive together are close: any PORT_SPAN consecutive ids
    (array tasks have ids of their own: 552 and 553 are tasks 55_2 and 55_3's only if Slurm
    gave them those) map to PORT_SPAN different ports."""
    for first in (1, 552, 11_999, 4_000_000_123):
        ports = {port_for_job(str(i)) for i in range(first, first + PORT_SPAN)}
        assert len(ports) == PORT_SPAN


def test_the_ports_are_below_the_kernels_ephemeral_range() -> None:
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not path.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    low = int(path.read_text().split()[0])
    ports = [port_for_job(str(i)) for i in range(0, 3 * PORT_SPAN, 7)]
    assert max(ports) < low and min(ports) >= 1024


def test_a_label_counts_by_its_digits() -> None:
    assert port_for_job("manual") == port_for_job("0")
    assert port_for_job("55") == port_for_job("j55")


def test_two_clusters_jobs_of_one_id_get_different_ports() -> None:
    """Job ids are each cluster's own: the local test clusters (one host) both have a job 1,
    and a sweep over both ran them at once. Each cluster's ids are shifted by its own offset,
    so any PORT_SPAN consecutive ids of one cluster still get PORT_SPAN ports, and the same id
    on the two local clusters does not share one (the offsets, by hand: CRC-32 of the names
    mod 12000, 8121 and 7305)."""
    import zlib

    assert [zlib.crc32(c.encode()) % PORT_SPAN for c in ("sqlocal", "sqlocal2")] == [8121, 7305]
    for job in ("1", "2", "552"):
        assert port_for_job(job, "sqlocal") != port_for_job(job, "sqlocal2")
    assert port_for_job("1", "sqlocal") == 20000 + (1 + 8121) % PORT_SPAN
    assert len({port_for_job(str(i), "sqlocal2") for i in range(1, 1 + PORT_SPAN)}) == PORT_SPAN
    # the ids the local clusters reach in a CI run (91 on the first, 5 on the second) never meet
    first = {port_for_job(str(i), "sqlocal") for i in range(1, 700)}
    assert not first & {port_for_job(str(i), "sqlocal2") for i in range(1, 100)}
    assert port_for_job("7", "") == port_for_job("7")  # no cluster (the local executor): as before
