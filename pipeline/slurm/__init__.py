"""Slurm: every client command (`commands`: scontrol, sinfo, squeue, sacct, scancel, sbatch,
bounded in time) and the parsing of what they say (`cluster`). Used from the login node and
from inside the job, through the Slurm scheduler (pipeline.sched.slurm) alone.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import
`config.schema`; never torch, deepspeed, transformers, peft, bitsandbytes, mlflow, submitit, hydra.
"""
