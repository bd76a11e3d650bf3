"""Who raised an exception: the partition's device, driver or collective, or the tool itself.
Decided by the exception's type and where it was raised, never by words in its message (a
KeyError('nccl_timeout_s') or an AttributeError about pynvml is the tool's own defect).

The partition's failures reach Python in two ways:
- as the library's own exception types: torch.distributed's DistError family (DistBackendError
  for NCCL and gloo failures, DistNetworkError, DistStoreError), torch's AcceleratorError (a
  CUDA error of the device), nvidia-ml-py's NVMLError (the driver through NVML);
- as a plain RuntimeError raised by the library's C++ beneath a collective or a device call:
  gloo's "Connection closed by peer" is a RuntimeError whose innermost Python frame is
  torch.distributed's (measured with torch 2.13); CUDA errors of older torch are RuntimeErrors
  raised inside torch.cuda.

Only the classes of modules already imported are looked up: an exception cannot be an instance
of a class that was never loaded, and the login node never imports torch.
"""

from __future__ import annotations

import sys
from types import TracebackType

COLLECTIVE_MODULES = ("torch.distributed", "deepspeed.comm")
"""Modules whose RuntimeErrors come from a collective (c10d's C++ beneath them)."""
DEVICE_MODULES = ("torch.cuda", "pynvml")
"""Modules whose RuntimeErrors come from the device or its driver."""


def _library_types(*names: tuple[str, str]) -> tuple[type[BaseException], ...]:
    found = []
    for module, attr in names:
        cls = getattr(sys.modules.get(module), attr, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def _innermost_module(tb: TracebackType | None) -> str:
    """The module (its __name__) of the frame that raised: the innermost of the traceback."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return str(last.tb_frame.f_globals.get("__name__", "")) if last is not None else ""


def raised_in(exc: BaseException, modules: tuple[str, ...]) -> bool:
    """A RuntimeError (how C++ errors surface) raised by a frame of one of these modules."""
    if not isinstance(exc, RuntimeError):
        return False
    where = _innermost_module(exc.__traceback__)
    return any(where == m or where.startswith(m + ".") for m in modules)


def is_collective_failure(exc: BaseException) -> bool:
    """A collective failed: torch.distributed's own error types, or a RuntimeError raised from
    inside torch.distributed or deepspeed.comm (a peer gone, a collective timed out)."""
    return isinstance(exc, _library_types(("torch.distributed", "DistError"))) or raised_in(
        exc, COLLECTIVE_MODULES
    )


def is_device_failure(exc: BaseException) -> bool:
    """The device or its driver failed: torch's AcceleratorError, NVML's NVMLError, or a
    RuntimeError raised from inside torch.cuda or pynvml."""
    types = _library_types(("torch", "AcceleratorError"), ("pynvml", "NVMLError"))
    return isinstance(exc, types) or raised_in(exc, DEVICE_MODULES)
