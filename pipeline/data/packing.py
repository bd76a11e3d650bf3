"""Samples of a chat set into micro-batches: padded or packed (`data.packing`). Torch-free: the
login node sizes the memory fit from the same layout the job trains on.

- pad: a micro-batch is `micro_batch` samples padded to the longest of them (pad id 0, target
  -100, attention mask 0). Drawn at random per (seed, step, micro, rank); with
  `data.group_by_length`, a micro-batch is one group of `micro_batch` neighbours in length order,
  so little is padded.
- pack: the samples go into bins of model.seq_len positions by best-fit decreasing (each sample,
  longest first, into the fullest bin it still fits in, else a new bin); a micro-batch is
  `micro_batch` bins. Each sample's position_ids restart at 0 and no attention mask is passed,
  so transformers builds a block-diagonal causal mask from them and no sample attends to
  another. The unfilled tail of a bin is one more run of positions (pad ids, targets -100).

Counts, per micro-batch and per split: positions computed (rows x width), real tokens (the
samples' positions), loss-bearing tokens (targets not -100). Padding efficiency = real /
positions; a packed split's fill = real / (bins x seq_len).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

import numpy as np

from pipeline.data.chatset import Samples

Key = tuple[int, int, int]


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Bins of sample indices, each holding at most `capacity` positions: every sample, longest
    first, goes into the bin with the least room that still holds it (a new bin if none does).
    O(n log n) over a sorted list of (room, bin)."""
    bins: list[list[int]] = []
    rooms: list[tuple[int, int]] = []  # (room left, bin index), sorted
    for i in sorted(range(len(lengths)), key=lambda k: (-int(lengths[k]), k)):
        n = int(lengths[i])
        if n > capacity:
            raise ValueError(f"sample {i} has {n} positions, more than a bin of {capacity}")
        j = bisect.bisect_left(rooms, (n, -1))
        if j < len(rooms):
            room, b = rooms.pop(j)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        if room - n > 0:
            bisect.insort(rooms, (room - n, b))
    return bins


@dataclass(frozen=True)
class Counts:
    positions: int
    real: int
    loss: int

    def __add__(self, o: Counts) -> Counts:
        return Counts(self.positions + o.positions, self.real + o.real, self.loss + o.loss)


ZERO = Counts(0, 0, 0)


@dataclass(frozen=True)
class MicroBatch:
    """Numpy arrays of one micro-batch: inputs, targets (-100 where not trained) and either
    position_ids (packed) or an attention mask (padded)."""

    tokens: np.ndarray
    targets: np.ndarray
    position_ids: np.ndarray | None
    attention_mask: np.ndarray | None

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"tokens": self.tokens, "targets": self.targets}
        if self.position_ids is not None:
            out["position_ids"] = self.position_ids
        if self.attention_mask is not None:
            out["attention_mask"] = self.attention_mask
        return out


class Layout:
    """How one split's samples become micro-batches (`packing`: pad | pack)."""

    def __init__(
        self, samples: Samples, packing: str, micro_batch: int, seq_len: int, seed: int, group_by_length: bool
    ) -> None:
        self.samples, self.packing, self.micro_batch, self.seq_len = samples, packing, micro_batch, seq_len
        self.seed, self.group_by_length = seed, group_by_length

    @functools.cached_property
    def bins(self) -> list[list[int]]:
        """Packed: the bins; padded: groups of micro_batch neighbours in length order (grouped) or
        each sample alone."""
        pos = self.samples.positions
        if self.packing == "pack":
            return best_fit_decreasing(pos, self.seq_len)
        if self.group_by_length:
            order = sorted(range(len(pos)), key=lambda k: (int(pos[k]), k))
            return [order[i : i + self.micro_batch] for i in range(0, len(order), self.micro_batch)]
        return [[i] for i in range(len(pos))]

    def fill(self) -> float | None:
        """A packed split's real positions over its bins' capacity (None: padded)."""
        if self.packing != "pack" or not self.bins:
            return None
        return float(self.samples.positions.sum()) / (len(self.bins) * self.seq_len)

    def rows_of(self, key: Key) -> list[list[int]]:
        """The rows of a training micro-batch: sample indices per row, a pure function of
        (seed, step, micro, rank)."""
        step, micro, rank = key
        rng = np.random.default_rng([self.seed, step, micro, rank])
        if self.packing == "pack":
            return [self.bins[int(b)] for b in rng.integers(0, len(self.bins), size=self.micro_batch)]
        if self.group_by_length:
            return [[i] for i in self.bins[int(rng.integers(0, len(self.bins)))]]
        return [[int(i)] for i in rng.integers(0, len(self.samples), size=self.micro_batch)]

    def eval_rows(self) -> list[list[list[int]]]:
        """Every sample of the split once, as micro-batches (packed bins, or samples in length order)."""
        if self.packing == "pack":
            units = self.bins
        else:
            pos = self.samples.positions
            units = [[i] for i in sorted(range(len(pos)), key=lambda k: (int(pos[k]), k))]
        return [units[i : i + self.micro_batch] for i in range(0, len(units), self.micro_batch)]

    def width(self, rows: list[list[int]]) -> int:
        if self.packing == "pack":
            return self.seq_len
        return max(int(self.samples.positions[r].sum()) for r in rows)

    def counts(self, rows: list[list[int]]) -> Counts:
        pos, loss = self.samples.positions, self.samples.loss_tokens
        real = sum(int(pos[r].sum()) for r in rows)
        return Counts(len(rows) * self.width(rows), real, sum(int(loss[r].sum()) for r in rows))

    def build(self, rows: list[list[int]]) -> MicroBatch:
        width = self.width(rows)
        tokens = np.zeros((len(rows), width), dtype=np.int64)
        targets = np.full((len(rows), width), -100, dtype=np.int64)
        pack = self.packing == "pack"
        positions = np.zeros((len(rows), width), dtype=np.int64) if pack else None
        mask = None if pack else np.zeros((len(rows), width), dtype=np.int64)
        for r, row in enumerate(rows):
            at = 0
            for i in row:
                x, y = self.samples.pair(i)
                n = len(x)
                tokens[r, at : at + n], targets[r, at : at + n] = x, y
                if positions is not None:
                    positions[r, at : at + n] = np.arange(n)
                if mask is not None:
                    mask[r, at : at + n] = 1
                at += n
            if positions is not None and at < width:  # the bin's tail: a run of its own
                positions[r, at:] = np.arange(width - at)
        return MicroBatch(tokens, targets, positions, mask)


def step_keys(step: int, grad_accum: int, world: int, data_world: int) -> list[Key]:
    """Every (step, micro, rank) key of one optimizer step over all ranks (pipeline.train.data
    StepSampler's, laid out for data_world ranks)."""
    per_rank = grad_accum * world // data_world
    return [(step, m, r) for r in range(data_world) for m in range(per_rank)]
