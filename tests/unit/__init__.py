"""Tests that run in one process on a CPU in seconds (no slow, slurm, gpu or browser mark): `make test-fast`."""
