"""slurm-qualify: qualify Slurm GPU partitions for LLM fine-tuning.

The subpackages say where their code runs (docs/design.md, "Layout"):

- login node: `config` (schema, composition, validation), `submit` (sweep, manifest, launcher,
  status, discover), `slurm` (every Slurm client command), `tracking` (MLflow keys, ledger,
  store), `home` (where config and runs live) and `cli`. Torch-free.
- inside the job: `job` (entry, attempt, runner, drills, reshape, distributed environment) and
  `train` (DeepSpeed trainer, model, checkpoints, device probes).
- anywhere: `measure`, pure arithmetic (FLOPs, memory, bandwidth, cost, statistics).

`tests/unit/test_boundaries.py` enforces what each may import.
"""
