"""The fine-tune itself: the DeepSpeed trainer and its loop (`trainer`), the model (`model`),
checkpoints that are never half taken (`checkpoint`) and the device probes (`probes`). Knows
nothing of Hydra, OmegaConf, submitit or MLflow: it gets plain config sections (`config.schema`
dataclasses), a metrics sink (the metrics' names from `tracking.keys`), hooks and a stop flag.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `measure`,
`config.schema`, `config.pretrained`, `config.dsconfig`, `data`, `tracking.keys`, `files`; never hydra, omegaconf,
submitit, mlflow.
"""
