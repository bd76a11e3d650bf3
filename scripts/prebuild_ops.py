"""Build, at install time, the DeepSpeed C++ ops a job would otherwise JIT-compile on its
first use: the shared-memory collectives DeepSpeed loads at every `init_distributed` on a CPU
(about 35 s here) and CPU Adam, the optimizer of offload points (about 60 s). Built once into
the venv's own extension cache (`<venv>/torch_extensions`, TORCH_EXTENSIONS_DIR: the one every
job of this venv uses, pipeline.job.startup.use_venv_ops_cache), the first point of a sweep starts
as fast as the tenth, and another checkout's venv never makes them stale. An op this machine cannot build is reported and skipped (its points build or refuse
it themselves)."""

from __future__ import annotations

import time


def main() -> int:
    from pipeline.job.startup import use_venv_ops_cache

    cache = use_venv_ops_cache()  # before torch reads it
    print(f"prebuild: into {cache or 'torch default extension cache (not in a venv)'}")
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    for name in ("ShareMemCommBuilder", "CPUAdamBuilder"):
        builder = accel.create_op_builder(name)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            print(
                f"prebuild: {name}: not used or not buildable on this {accel.device_name()} machine; skipped"
            )
            continue
        t0 = time.perf_counter()
        try:
            builder.load(verbose=False)
        except Exception as e:  # a missing compiler: the job will say so when it needs the op
            print(
                f"prebuild: {name}: failed ({type(e).__name__}: {str(e)[:200]}); jobs will build it on first use"
            )
            continue
        print(f"prebuild: {builder.absolute_name()} ready ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
