"""Configuration, on the login node: the typed schema (`schema`, one dataclass per config group,
no Hydra import, also read by the job), Hydra composition of sweep points (`compose`), the
checks of every point before anything is submitted (`validate`), and a resolved config back
from YAML without Hydra (`resolved`).

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `config`,
`drills`, `home`, `measure`, `tracking.keys`, `tracking.redact`, `data`, `files`; never torch,
deepspeed, transformers, peft, bitsandbytes, mlflow, submitit, hydra.
"""
