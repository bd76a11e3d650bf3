"""The login node's side of a sweep: plan and submit it (`sweep`), its folder and manifest
(`manifest`), the executors (`launcher`), the checks against the cluster (`checks`), where it
stands (`status`) and conf stubs from the cluster (`discover`). Torch-free: it may import
`config`, `slurm`, `tracking`, `measure`, `home` and, of `job`, only the contract (`job.spec`,
`job.task`, `job.pointdir`); never torch, DeepSpeed or `train`."""
