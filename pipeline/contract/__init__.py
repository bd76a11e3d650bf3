"""What crosses the boundary between the login node and the job, below both `submit/` and
`job/`: what the sweep hands each job (`spec`), how a point ends (`outcome`: the outcome and
reason enums), the point folder (`pointdir`) and the sweep folder with its manifest
(`sweepdir`), the attempt records (`records`), what they cost (`accounting`, pure), the bytes
of the checkpoints a point kept (`retention`), the sweep's parent run, closed once by whichever
side sees the last outcome (`parent`), and the node's GPU inventory through NVML (`gpu`), read
the same way by the login node's checks and the job's. Torch-free.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import
`config.schema`, `measure`, `sched`, `tracking`, `files`; never torch, deepspeed, transformers,
peft, bitsandbytes, hydra, submitit.
"""
