"""Configuration, on the login node: the typed schema (`schema`, one dataclass per config group,
no Hydra import, also read by the job), Hydra composition of sweep points (`compose`), the
checks of every point before anything is submitted (`validate`), and a resolved config back
from YAML without Hydra (`resolved`). May import `measure`, `home` and `tracking.keys`; never
torch, DeepSpeed, MLflow, submitit, `job`, `train` or `submit`."""
