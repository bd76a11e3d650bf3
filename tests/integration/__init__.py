"""Test files with a multi-process DeepSpeed, Slurm, GPU or browser test (marked), and their cheaper checks."""
