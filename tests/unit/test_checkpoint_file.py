"""The checkpoint writer's file: every byte written lands on disk in order, whatever the chunk
sizes (across the O_DIRECT buffers and the alignment padding), its CRC-32 is the file's, and a
torch.save through it loads back equal."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.train.checkpoint import CheckpointFile, hash_file

# around and across the 4 KiB alignment and the 8 MiB buffers
CHUNKS = [1, 4095, 4096, 4097, 0, (8 << 20) - 5, 10, (8 << 20) + 3, 3 << 20, 12345]


@pytest.mark.parametrize("direct", [True, False])
def test_bytes_size_and_crc_are_exact(tmp_path: Path, direct: bool) -> None:
    data = [os.urandom(n) for n in CHUNKS]
    path = tmp_path / "f.bin"
    f = CheckpointFile(path, direct)
    assert f.direct == direct  # this machine's ext4 and tmpfs take O_DIRECT
    for chunk in data:
        assert f.write(memoryview(chunk)) == len(chunk)
    f.close()
    whole = b"".join(data)
    assert path.read_bytes() == whole
    assert f.nbytes == len(whole) == path.stat().st_size
    assert f.crc32 == f"{zlib.crc32(whole):08x}" == hash_file(path)


def test_torch_save_through_it_loads_back_equal(tmp_path: Path) -> None:
    state: dict[str, Any] = {
        "w": torch.randn(1000, 3001),  # 12 MB: spans both buffers
        "bf16": torch.randn(777).to(torch.bfloat16),
        "step": torch.tensor(7),
        "nested": {"moments": [torch.randn(5, 5), torch.zeros(0)]},
    }
    path = tmp_path / "state.pt"
    f = CheckpointFile(path, direct=True)
    torch.save(state, f)  # type: ignore[arg-type]
    f.close()
    back: dict[str, Any] = torch.load(path, weights_only=True)
    assert back["w"].equal(state["w"]) and back["bf16"].equal(state["bf16"])
    assert back["step"].item() == 7 and back["nested"]["moments"][0].equal(state["nested"]["moments"][0])
    assert f.crc32 == hash_file(path)


def test_an_abandoned_file_is_closed_without_its_tail(tmp_path: Path) -> None:
    """A save that fails part-way closes the file without padding or truncating it; the
    manifest never names it, so what it holds is never taken for a checkpoint."""
    path = tmp_path / "f.bin"
    f = CheckpointFile(path, direct=True)
    f.write(os.urandom((8 << 20) + 100))  # one full buffer handed to the disk, 100 bytes pending
    f.close(complete=False)
    assert path.stat().st_size == 8 << 20
