"""MLflow, without losing anything: every key the project logs (`keys`), the append-first
ledger each job logs through and its replay (`ledger`), and the store and the login node's
run calls (`store`). Torch-free.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `home`,
`files`; never torch, deepspeed, transformers, peft, bitsandbytes, submitit, hydra, omegaconf.
"""
