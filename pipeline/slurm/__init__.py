"""Slurm: every client command (`commands`: scontrol, sinfo, squeue, sacct, scancel, sbatch,
bounded in time) and the parsing of what they say (`cluster`). Used from the login node and
from inside the job. Imports nothing of the project but `config.schema`; never torch."""
