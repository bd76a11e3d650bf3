"""What a run trains and evaluates on, through a real torch DataLoader.

Every micro-batch is a pure function of (seed, step, micro-step, rank): the sampler lists the
(step, micro, rank) keys of this rank's steps, the dataset turns one key into a micro-batch. A
resumed run starts the sampler after its checkpoint's step and sees exactly the batches of the
uninterrupted run, with no loader state to save; workers only read ahead.

- synthetic: the counting task, made in memory (SyntheticTask);
- tokens / text: random windows of seq_len + 1 tokens from the training part of a
  memory-mapped token file (pipeline.data.tokenfile), evaluation on fixed windows of its tail;
- chat: samples of a chat set (pipeline.data.chatset), padded or packed per micro-batch
  (pipeline.data.packing), their prompt masked in the targets (-100); evaluation on the whole
  held-out split. A chat micro-batch is a dict of tensors (tokens, targets, and position_ids or
  attention_mask), passed to the model as keywords.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from pipeline.config.schema import DataConfig
from pipeline.data.chatset import ChatData, load_chat
from pipeline.data.packing import Counts, Layout, step_keys
from pipeline.data.tokenfile import TokenFile, resolve

Key = tuple[int, int, int]  # (step, micro-step, rank the samples are laid out for)
Batch = tuple[torch.Tensor, torch.Tensor]
Rows = torch.Tensor | np.ndarray  # (micro_batch, seq_len + 1) token ids: inputs and targets shifted by one
ChatBatch = dict[str, torch.Tensor]  # tokens, targets (-100: no loss), position_ids | attention_mask


class SyntheticTask:
    """Learnable synthetic data: each sequence counts up from a random start with a fixed
    stride over the first K = min(alphabet, V) token ids, t[i+1] = (t[i] + stride) mod K, so the
    next token is a fixed function of the current one and the loss falls from about ln V (a
    model that knows nothing) towards 0. K does not grow with the vocabulary, so the task is as
    hard for a 128k-token model as for a tiny one, and a frozen base with low-rank adapters can
    learn its first part (which tokens occur) as a full fine-tune does. Batches are a pure
    function of (seed, step, micro-step, rank)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, alphabet: int, stride: int = 7) -> None:
        self.vocab_size, self.seq_len, self.seed, self.stride = vocab_size, seq_len, seed, stride
        self.alphabet = min(alphabet, vocab_size)
        self._offsets = torch.arange(seq_len + 1) * stride

    def batch(self, step: int, micro: int, rank: int, micro_batch: int) -> Batch:
        # tuples of ints hash the same in every process (PYTHONHASHSEED only salts str/bytes)
        g = torch.Generator().manual_seed(hash((self.seed, step, micro, rank)) & 0x7FFFFFFF)
        start = torch.randint(0, self.alphabet, (micro_batch, 1), generator=g)
        full = (start + self._offsets) % self.alphabet
        return full[:, :-1].contiguous(), full[:, 1:].contiguous()


class SyntheticBatches(Dataset[Rows]):
    def __init__(self, task: SyntheticTask, micro_batch: int) -> None:
        self.task, self.micro_batch = task, micro_batch

    def __getitem__(self, key: Key) -> Rows:
        x, y = self.task.batch(*key, self.micro_batch)
        return torch.cat([x, y[:, -1:]], 1)

    def eval_set(self, n: int) -> Batch:
        """Held out: step 0 is never trained on (steps count from 1)."""
        return self.task.batch(0, 0, 0, n)


class TokenWindows(Dataset[Rows]):
    """Random windows of seq_len + 1 tokens from the training part of a token file. The file is
    opened lazily in each process (a memmap must not be pickled into the workers: that copies it)."""

    def __init__(self, tf: TokenFile, seq_len: int, seed: int, micro_batch: int) -> None:
        self.tf, self.seq_len, self.seed, self.micro_batch = tf, seq_len, seed, micro_batch
        self._arr: np.memmap | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arr": None}

    @property
    def arr(self) -> np.memmap:
        if self._arr is None:
            self._arr = self.tf.array()
        return self._arr

    def __getitem__(self, key: Key) -> Rows:
        """A numpy array, not a tensor: a worker hands a small array over its queue by value,
        faster than a tensor's shared-memory file descriptor."""
        step, micro, rank = key
        rng = np.random.default_rng([self.seed, step, micro, rank])
        starts = rng.integers(0, self.tf.n_train - self.seq_len, size=self.micro_batch)
        return self._windows(starts)

    def _windows(self, starts: np.ndarray) -> np.ndarray:
        w = self.seq_len + 1
        return np.stack([np.asarray(self.arr[s : s + w], dtype=np.int64) for s in starts])

    def eval_set(self, n: int) -> Batch:
        """The first n non-overlapping windows of the held-out tail (fewer if it is shorter)."""
        w = self.seq_len + 1
        count = max(1, min(n, self.tf.n_eval // w))
        return split_rows(self._windows(self.tf.n_train + np.arange(count) * w))


class ChatBatches(Dataset[dict[str, np.ndarray]]):
    """Micro-batches of a chat set's training split (padded or packed), a pure function of the
    key; the held-out split whole, in micro-batches."""

    def __init__(
        self, data: ChatData, packing: str, micro_batch: int, seq_len: int, seed: int, group: bool
    ) -> None:
        self.data = data
        self.train = Layout(data.train, packing, micro_batch, seq_len, seed, group)
        self.held = Layout(data.eval, packing, micro_batch, seq_len, seed, group)

    def __getitem__(self, key: Key) -> dict[str, np.ndarray]:
        return self.train.build(self.train.rows_of(key)).arrays()

    def step_counts(self, step: int, grad_accum: int, world: int, data_world: int) -> Counts:
        """Positions, real and loss-bearing tokens of one optimizer step over all ranks,
        computed from the keys alone (no collective: every rank knows every key's samples)."""
        total = Counts(0, 0, 0)
        for key in step_keys(step, grad_accum, world, data_world):
            total = total + self.train.counts(self.train.rows_of(key))
        return total

    def eval_batches(self) -> list[dict[str, torch.Tensor]]:
        return [
            {k: torch.as_tensor(v) for k, v in self.held.build(rows).arrays().items()}
            for rows in self.held.eval_rows()
        ]


def split_rows(rows: Rows) -> Batch:
    full = torch.as_tensor(rows)
    return full[:, :-1].contiguous(), full[:, 1:].contiguous()


def _as_is(rows: Any) -> Any:
    return rows


class StepSampler(Sampler[Key]):
    """The keys of this rank's micro-batches for steps first..last, in training order. A run on
    fewer ranks than `data_world` (the reshape drill) takes, on each rank, the micro-batches of
    data_world / world original ranks one after the other, so the global batch is the same."""

    def __init__(
        self, first: int, last: int, rank: int, world: int, data_world: int, grad_accum: int
    ) -> None:
        self.first, self.last, self.rank, self.grad_accum = first, last, rank, grad_accum
        self.folded = data_world // world
        self.per_rank = grad_accum // self.folded

    def __iter__(self) -> Iterator[Key]:
        for step in range(self.first, self.last + 1):
            for micro in range(self.grad_accum):
                yield step, micro % self.per_rank, self.rank * self.folded + micro // self.per_rank

    def __len__(self) -> int:
        return max(0, self.last - self.first + 1) * self.grad_accum


@dataclass
class ReadProbe:
    """The loader's read throughput, measured before training."""

    tokens_per_s: float
    mb_per_s: float | None  # bytes read from the token file; None for synthetic and chat (no token file)


class DataSource:
    """The dataset of a run and the loaders over it. `batches(first, last)` starts one."""

    def __init__(
        self, cfg: DataConfig, vocab_size: int, seq_len: int, seed: int, micro_batch: int, pin: bool
    ) -> None:
        self.cfg, self.seq_len, self.micro_batch, self.pin = cfg, seq_len, micro_batch, pin
        self.chat: ChatBatches | None = None
        self.token_file = None if cfg.kind == "chat" else resolve(cfg)
        self.dataset: SyntheticBatches | TokenWindows | ChatBatches
        if cfg.kind == "chat":
            data = load_chat(cfg, seq_len)
            self.dataset = self.chat = ChatBatches(
                data, cfg.packing, micro_batch, seq_len, seed, cfg.group_by_length
            )
        elif self.token_file is None:
            self.dataset = SyntheticBatches(
                SyntheticTask(vocab_size, seq_len, seed, cfg.alphabet), micro_batch
            )
        else:
            self.dataset = TokenWindows(self.token_file, seq_len, seed, micro_batch)

    def loader(self, sampler: StepSampler) -> DataLoader[Rows]:
        workers = self.cfg.num_workers
        return DataLoader(
            self.dataset,  # type: ignore[arg-type]
            batch_size=None,  # a key is a whole micro-batch
            sampler=sampler,
            num_workers=workers,
            collate_fn=_as_is,  # numpy stays numpy across the worker queue (see TokenWindows)
            prefetch_factor=self.cfg.prefetch_factor if workers else None,
        )

    def batches(self, sampler: StepSampler) -> Batches:
        return Batches(self.loader(sampler), pin=self.pin)

    def eval_set(self) -> Batch:
        assert not isinstance(self.dataset, ChatBatches), "a chat set evaluates with chat.eval_batches()"
        return self.dataset.eval_set(self.cfg.eval_sequences)

    def probe(
        self, first_step: int, batches: int, rank: int, world: int, grad_accum: int
    ) -> ReadProbe | None:
        """Read `batches` micro-batches through a loader like the run's, at steps the run never
        trains on (from `first_step`); time all but the first (worker start-up)."""
        if batches < 2:
            return None
        steps = -(-batches // grad_accum)
        it = iter(
            self.loader(StepSampler(first_step, first_step + steps - 1, rank, world, world, grad_accum))
        )
        next(it)
        t0 = time.perf_counter()
        n = tokens = 0
        for _, item in zip(range(batches - 1), it, strict=False):
            n += 1  # chat: the positions of the micro-batch read; else micro_batch x seq_len
            tokens += item["tokens"].size if isinstance(item, dict) else self.micro_batch * self.seq_len
        dt = time.perf_counter() - t0
        del it
        read_bytes = (
            n * self.micro_batch * (self.seq_len + 1) * self.token_file.itemsize if self.token_file else None
        )
        return ReadProbe(tokens / dt, read_bytes / dt / 1e6 if read_bytes is not None else None)


class Batches:
    """An iterator over micro-batches that times how long each one was waited for (the wait
    includes pinning the batch for an asynchronous copy to the GPU)."""

    def __init__(self, loader: DataLoader[Rows], pin: bool = False) -> None:
        self._it: Iterator[Rows] | None = iter(loader)
        self.pin = pin

    def next(self) -> tuple[Batch | ChatBatch, float]:
        assert self._it is not None, "the batches of this run were closed"
        t0 = time.perf_counter()
        item = next(self._it)
        if isinstance(item, dict):  # a chat micro-batch
            chat = {k: torch.as_tensor(v) for k, v in item.items()}
            if self.pin:
                chat = {k: v.pin_memory() for k, v in chat.items()}
            return chat, time.perf_counter() - t0
        full = torch.as_tensor(item)
        if self.pin:
            full = full.pin_memory()
        x, y = split_rows(full)
        return (x, y), time.perf_counter() - t0

    def close(self) -> None:
        """Stop the workers (they also stop when the iterator is collected)."""
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


class NullBatches(Batches):
    def __init__(self) -> None:
        self._it = None
