"""The login node's side of a sweep: plan and submit it (`sweep`), where sweeps are and the
parent run (`manifest`; the folder's layout and the manifest's type are `contract.sweepdir`'s),
the executors (`launcher`), the checks against the cluster (`checks`), where it stands
(`status`) and conf stubs from the cluster (`discover`). Torch-free: of the job it imports only
the callable submitit pickles (`job.task`); what crosses over is `pipeline.contract`'s.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `config`,
`drills`, `sched`, `tracking`, `measure`, `home`, `contract`, `job.task`, `files`; never torch,
deepspeed, transformers, peft, bitsandbytes.
"""
