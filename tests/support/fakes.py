"""Stand-ins with the exact interface of what they replace, for fast tests of the logic above
them. The checkpoint manager's engine (DeepSpeed's `save_checkpoint`, `load_checkpoint` and
`checkpoint_engine`) and collectives (the trainer's DistComm) for one process; the files they
write are real, in the test's folder."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import torch

MODEL_FILE = "mp_rank_00_model_states.pt"


def optim_file(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


class TorchCheckpointEngine:
    """DeepSpeed's TorchCheckpointEngine (deepspeed/runtime/checkpoint_engine/
    torch_checkpoint_engine.py), same name (durable_writer checks it) and methods: torch.save
    and torch.load to a path. `fail_after_bytes` makes a save write that many bytes of its file
    and then fail the way a full disk does (ENOSPC)."""

    def __init__(self) -> None:
        self.name = "TorchCheckpointEngine"
        self.zipfile_serialization = False  # DeepSpeed's default without a config
        self.fail_after_bytes: int | None = None

    def create(self, info: Any) -> None:
        pass

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        if self.fail_after_bytes is None:
            torch.save(state_dict, path, _use_new_zipfile_serialization=self.zipfile_serialization)
            return
        with open(path, "wb") as f:
            f.write(os.urandom(self.fail_after_bytes))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    def load(self, path: str, map_location: Any = None) -> Any:
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: Any) -> bool:
        return True


class FakeEngine:
    """The calls CheckpointManager makes on a DeepSpeed engine, nothing more. Its state is one
    weight tensor and one optimizer tensor of `numel` floats, set from the step, so what a load
    brings back says which checkpoint it was. Like DeepSpeed's, a save writes the model file
    (rank 0) and this rank's optimizer shard into <save_dir>/<tag>/ through
    `checkpoint_engine.save`, and drops zero_to_fp32.py into <save_dir>."""

    def __init__(self, rank: int = 0, numel: int = 4096) -> None:
        self.rank, self.numel = rank, numel
        self.checkpoint_engine: Any = TorchCheckpointEngine()
        self.weight = torch.zeros(numel)
        self.optim = torch.zeros(numel)
        self.saved_into: list[Path] = []  # the folder each save wrote to
        self.loaded: list[str] = []  # the tags loaded
        self.on_save: Any = None  # called with the save folder before the files are written

    def set_step(self, step: int) -> None:
        self.weight = torch.full((self.numel,), float(step))
        self.optim = torch.full((self.numel,), -float(step))

    def save_checkpoint(
        self,
        save_dir: str,
        tag: str,
        client_state: dict[str, Any] | None = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        folder = Path(save_dir) / tag
        self.checkpoint_engine.makedirs(str(folder), exist_ok=True)
        self.saved_into.append(folder)
        if self.on_save is not None:
            self.on_save(folder)
        self.checkpoint_engine.create(tag)
        if self.rank == 0:
            model = {"module": {"weight": self.weight.clone()}, **(client_state or {})}
            self.checkpoint_engine.save(model, str(folder / MODEL_FILE))
        self.checkpoint_engine.save({"optim": self.optim.clone()}, str(folder / optim_file(self.rank)))
        self.checkpoint_engine.commit(tag)
        if self.rank == 0:
            (Path(save_dir) / "zero_to_fp32.py").write_text("# DeepSpeed's converter\n")
        if save_latest:
            (Path(save_dir) / "latest").write_text(tag)
        return True

    def load_checkpoint(
        self,
        load_dir: str,
        tag: str | None = None,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_strict: bool = True,
    ) -> tuple[str, dict[str, Any]]:
        assert tag is not None, "CheckpointManager always names the tag"
        folder = Path(load_dir) / tag
        model = self.checkpoint_engine.load(str(folder / MODEL_FILE), map_location="cpu")
        self.weight = model.pop("module")["weight"]
        if load_optimizer_states:
            self.optim = self.checkpoint_engine.load(str(folder / optim_file(self.rank)))["optim"]
        self.loaded.append(tag)
        return str(folder), model


class LocalComm:
    """The trainer's DistComm (barrier, all_ok, gather_obj, broadcast_obj) for a world of one."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def barrier(self) -> None:
        self.calls.append("barrier")

    def all_ok(self, ok: bool) -> bool:
        self.calls.append("all_ok")
        return ok

    def gather_obj(self, obj: Any) -> list[Any]:
        self.calls.append("gather_obj")
        return [obj]

    def broadcast_obj(self, obj: Any) -> Any:
        self.calls.append("broadcast_obj")
        return obj
