"""The fine-tune itself: the DeepSpeed trainer and its loop (`trainer`), the model (`model`),
checkpoints that are never half taken (`checkpoint`) and the device probes (`probes`). Knows
nothing of Hydra, OmegaConf, submitit or MLflow: it gets plain config sections (`config.schema`
dataclasses), a metrics sink, hooks and a stop flag. May import `measure` and `config.schema`."""
