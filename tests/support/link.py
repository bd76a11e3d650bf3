"""A link of known speed to calibrate the communication model on (docs/design.md, "Projection"):
network namespaces of our own, one per rank, joined by veth pairs to a bridge that lives in a
namespace of its own too (the host's network is never touched), `tc tbf` on each rank's egress at
a known rate, and gloo ranks inside the namespaces timing all-reduces (tests/support/link_rank.py).

gloo runs over TCP: what the shaper counts is the Ethernet frame (1514 bytes for 1448 bytes of
TCP payload with timestamps at MTU 1500: 95.6%), so the fitted bus bandwidth of the payload is
expected near 0.956 x the imposed rate. netem is not in these machines' kernel: no latency is
imposed, only a rate. Needs root (CAP_NET_ADMIN); every namespace is deleted on exit, on failure
too. Addresses are 10.248.0.x inside the namespaces this module makes, nowhere else.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.measure.scaling import AlphaBeta, Timing, fit_alpha_beta

ETH_FRAME = 1514
TCP_PAYLOAD = 1448  # MTU 1500 - IP 20 - TCP 20 - timestamps 12
TCP_EFFICIENCY = TCP_PAYLOAD / ETH_FRAME
SUBNET = "10.248.0"
IFNAME = "sqlink"


def why_not() -> str | None:
    """Why namespaces cannot be made here (None when they can): root and iproute2 are needed."""
    if os.geteuid() != 0:
        return f"network namespaces need root (CAP_NET_ADMIN); running as uid {os.geteuid()}"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    probe = f"sqprobe{os.getpid()}"  # root in a container may still lack CAP_NET_ADMIN
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip() or made.returncode}"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Link:
    """The namespaces of one emulated link: `ranks` of them, each shaped to `rate_mbit`."""

    prefix: str
    ranks: int
    rate_mbit: float

    def ns(self, rank: int) -> str:
        return f"{self.prefix}-r{rank}"

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def addr(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"


def _build(link: Link) -> None:
    _ip("netns", "add", link.hub)
    _ip("-n", link.hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", link.hub, "link", "set", "br0", "up")
    _ip("-n", link.hub, "link", "set", "lo", "up")
    for r in range(link.ranks):
        ns, peer = link.ns(r), f"p{r}"
        _ip("netns", "add", ns)
        _ip("-n", link.hub, "link", "add", peer, "type", "veth", "peer", "name", IFNAME, "netns", ns)
        _ip("-n", link.hub, "link", "set", peer, "master", "br0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{link.addr(r)}/24", "dev", IFNAME)
        _ip("-n", ns, "link", "set", IFNAME, "up")
        # the rank's egress: a token bucket at the imposed rate (burst: a few frames' worth)
        subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", IFNAME, "root", "tbf",
             "rate", f"{link.rate_mbit:g}mbit", "burst", "32kb", "latency", "400ms"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip


def _teardown(link: Link) -> None:
    for ns in [link.ns(r) for r in range(link.ranks)] + [link.hub]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextlib.contextmanager
def emulated_link(ranks: int, rate_mbit: float, prefix: str | None = None) -> Iterator[Link]:
    """The namespaces, shaped, for the duration of the block; deleted after, whatever happens."""
    link = Link(prefix or f"sqlink{os.getpid()}", ranks, rate_mbit)
    try:
        _build(link)
        yield link
    finally:
        _teardown(link)


def run_ranks(
    link: Link, sizes: Sequence[int], groups: Sequence[int], reps: int, timeout_s: float = 240
) -> list[dict]:
    """One gloo rank in each namespace; rank 0's timings: per (ranks, size), seconds a call. The
    ranks run at nice -5 (root): they use little CPU (about 2 core-s each, most of it imports),
    and on a busy machine a rank waiting for a core would read as a slower link."""
    procs = []
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": IFNAME, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    args = ["--world", str(link.ranks), "--master", link.addr(0), "--reps", str(reps),
            "--sizes", ",".join(map(str, sizes)), "--groups", ",".join(map(str, groups))]  # fmt: skip
    for r in range(link.ranks):
        cmd = [
            "ip",
            "netns",
            "exec",
            link.ns(r),
            "nice",
            "-n",
            "-5",
            sys.executable,
            "-m",
            "tests.support.link_rank",
            "--rank",
            str(r),
            *args,
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    deadline = time.monotonic() + timeout_s
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"a rank failed (exit {p.returncode}): {err.strip()[-2000:]}")
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [json.loads(line) for line in outs[0].splitlines() if line.startswith("{")]


@dataclass(frozen=True)
class Calibration:
    """The fit on the `fit_ranks` timings and its prediction of the held-out rank counts."""

    rate_mbit: float
    fit: AlphaBeta
    rows: list[dict]
    fit_ranks: tuple[int, ...]

    @property
    def imposed_bytes_s(self) -> float:
        return self.rate_mbit * 1e6 / 8

    @property
    def payload_bytes_s(self) -> float:
        """The imposed rate net of the headers tbf counts: TCP payload at MTU 1500 (95.6%)."""
        return self.imposed_bytes_s * TCP_EFFICIENCY

    @property
    def bandwidth_error(self) -> float:
        """|fitted bus bandwidth - the imposed rate's TCP payload| / that payload rate."""
        return abs(self.fit.busbw - self.payload_bytes_s) / self.payload_bytes_s

    @property
    def raw_bandwidth_error(self) -> float:
        """|fitted bus bandwidth - imposed rate| / imposed rate (TCP's 4.4% overhead included)."""
        return abs(self.fit.busbw - self.imposed_bytes_s) / self.imposed_bytes_s

    def predicted_s(self, row: dict) -> float:
        return self.fit.time_s("all_reduce", row["size"], row["ranks"])

    @property
    def heldout(self) -> list[dict]:
        return [r for r in self.rows if r["ranks"] not in self.fit_ranks]

    @property
    def heldout_error(self) -> float:
        """The largest |predicted - measured| / measured over the held-out rank counts' sizes."""
        return max(abs(self.predicted_s(r) - r["seconds"]) / r["seconds"] for r in self.heldout)


def calibrate(rows: list[dict], rate_mbit: float, fit_ranks: Sequence[int]) -> Calibration:
    timings = [
        Timing("all_reduce", r["size"], r["ranks"], r["seconds"]) for r in rows if r["ranks"] in fit_ranks
    ]
    return Calibration(rate_mbit, fit_alpha_beta(timings, relative=True), rows, tuple(fit_ranks))


def measure(
    rate_mbit: float = 200,
    ranks: int = 4,
    sizes: Sequence[int] = (2 << 20, 4 << 20, 8 << 20),
    fit_ranks: Sequence[int] = (2, 3),
    reps: int = 5,
) -> Calibration:
    """Build the link, time all-reduces at every rank count 2..ranks, fit on `fit_ranks`.
    Sizes of 2 MiB and more: gloo's all-reduce is a ring, as the model's is at those sizes, and a
    ring step's wait for a core (4 ranks on 2 busy cores) stays a small part of each call: at
    1 MiB it once made the held-out 4 ranks 12-13% slower than predicted, at 4 MiB 2%."""
    with emulated_link(ranks, rate_mbit) as link:
        rows = run_ranks(link, sizes, list(range(2, ranks + 1)), reps)
    return calibrate(rows, rate_mbit, fit_ranks)
