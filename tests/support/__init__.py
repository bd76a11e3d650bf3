"""What the tests and benchmarks share, imported by name (`from tests.support.helpers import ...`):
helpers (compose, launch ranks, the CLI, MLflow read-back), fakes (a DeepSpeed engine and a
communicator), fake_nvml (pynvml's interface), flop_counter (FlopCounterMode on a transformers
model), data_fixtures, analysis_helpers (runs made through the MLflow API), slurm_fixtures
(the local Slurm and an MLflow server), and the worker scripts ckpt_worker and mem_worker."""
