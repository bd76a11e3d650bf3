"""Who pays for an exception (issue #46): the partition's faults (a crash, billed labor) by the
exception's type and where the library raised it, never by words in its message. The tool's
own defects that merely mention NCCL or NVML end `error` / `tool_error`, with no labor."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest

from pipeline.contract.accounting import needed_person
from pipeline.contract.outcome import Outcome, Reason
from pipeline.job.results import classify


def _caught(fn: object) -> BaseException:
    try:
        fn()  # type: ignore[operator]
    except BaseException as e:  # noqa: BLE001 (the exception under test, with its traceback)
        return e
    raise AssertionError("nothing was raised")


def _ends(exc: BaseException) -> tuple[str, str]:
    return classify(exc)[:2]


def test_an_attribute_error_about_pynvml_is_the_tools_own() -> None:
    import pynvml

    exc = _caught(lambda: pynvml.nvmlDeviceGetNoSuchThing)  # the tool called what nvidia-ml-py lacks
    assert "pynvml" in str(exc)
    assert _ends(exc) == (Outcome.ERROR, Reason.TOOL_ERROR)
    assert not needed_person(Outcome.ERROR, Reason.TOOL_ERROR)


def test_a_key_error_naming_nccl_is_the_tools_own() -> None:
    timeouts: dict[str, float] = {}
    exc = _caught(lambda: timeouts["nccl_timeout_s"])
    assert _ends(exc) == (Outcome.ERROR, Reason.TOOL_ERROR)


def test_an_import_error_of_a_module_named_nvml_is_the_tools_own() -> None:
    exc = _caught(lambda: importlib.import_module("pipeline.job.no_such_nvml_probe"))
    assert isinstance(exc, ImportError) and "nvml" in str(exc)
    assert _ends(exc) == (Outcome.ERROR, Reason.TOOL_ERROR)


def test_words_alone_never_make_a_crash() -> None:
    for exc in (
        RuntimeError("NCCL error: unhandled system error"),  # raised by the tool, not the library
        ValueError("nvml says no"),
        TypeError("cuda error in the tool's own arithmetic"),
    ):
        assert _ends(exc) == (Outcome.ERROR, Reason.TOOL_ERROR), exc


def test_an_nvml_failure_raised_by_the_library_is_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam: nvidia-ml-py's own call raises its own error class (the GPU fell off the bus)."""
    import pynvml

    def lost(index: int) -> object:  # the driver's return code, through the library's own check
        return pynvml._nvmlCheckReturn(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lost)
    exc = _caught(lambda: pynvml.nvmlDeviceGetHandleByIndex(0))
    assert isinstance(exc, pynvml.NVMLError) and exc.value == pynvml.NVML_ERROR_GPU_IS_LOST
    assert _ends(exc) == (Outcome.FAILED, Reason.CRASH)
    assert needed_person(Outcome.FAILED, Reason.CRASH)


def test_an_nccl_failure_raised_by_the_library_is_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam: the collective raises torch.distributed's own DistBackendError, as c10d does
    for an NCCL failure."""
    import torch
    import torch.distributed as dist

    def nccl_fails(tensor: torch.Tensor, *args: object, **kwargs: object) -> None:
        raise dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1971, unhandled cuda error")

    monkeypatch.setattr(dist, "all_reduce", nccl_fails)
    exc = _caught(lambda: dist.all_reduce(torch.ones(2)))
    assert _ends(exc) == (Outcome.FAILED, Reason.CRASH)


def test_a_store_that_does_not_answer_is_a_crash() -> None:
    """A real failure of torch.distributed's rendezvous store (no peer ever sets the key)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=0.2))
    exc = _caught(lambda: store.get("never_set"))
    assert isinstance(exc, dist.DistError)
    assert _ends(exc) == (Outcome.FAILED, Reason.CRASH)


def test_a_collective_called_wrongly_by_the_tool_is_its_own() -> None:
    """torch.distributed refuses a collective without a process group: a defect of the caller."""
    import torch
    import torch.distributed as dist

    assert not dist.is_initialized()
    exc = _caught(lambda: dist.all_reduce(torch.ones(2)))
    assert _ends(exc) == (Outcome.ERROR, Reason.TOOL_ERROR), exc


def test_a_runtime_error_raised_inside_torch_distributed_is_a_collectives() -> None:
    """gloo's "Connection closed by peer" is a plain RuntimeError whose innermost frame is
    torch.distributed's (torch 2.13); the origin, not the words, decides."""
    from pipeline.job.faults import is_collective_failure

    code = compile("def wait():\n    raise RuntimeError('[pair.cc:553] gone')\n", "c10d", "exec")
    where = {"__name__": "torch.distributed.distributed_c10d"}
    exec(code, where)  # a frame of that module, as c10d's C++ surfaces beneath all_reduce
    exc = _caught(where["wait"])
    assert is_collective_failure(exc)
    assert _ends(exc) == (Outcome.FAILED, Reason.CRASH)
    assert _ends(RuntimeError("[pair.cc:553] gone")) == (Outcome.ERROR, Reason.TOOL_ERROR)
