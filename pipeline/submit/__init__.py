"""The login node's side of a sweep: plan and submit it (`sweep`), where sweeps are and the
parent run (`manifest`; the folder's layout and the manifest's type are `job.sweepdir`'s), the
executors (`launcher`), the checks against the cluster (`checks`), where it
stands (`status`) and conf stubs from the cluster (`discover`). Torch-free: of `job`, only the
contract and the torch-free parts the login node shares with the job.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `config`,
`slurm`, `tracking`, `measure`, `home`, `job.spec`, `job.task`, `job.pointdir`, `job.records`,
`job.sweepdir`, `job.accounting`, `job.retention`, `job.parent`, `job.gpu`, `files`; never torch,
deepspeed, transformers, peft, bitsandbytes.
"""
