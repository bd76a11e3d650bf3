"""From MLflow runs to a decision record: the runs (`runs`, through the MLflow API only), the
references (`references`), one row per candidate (`table`), the report and its plots
(`report`, `plots`) and new references from a sweep (`baseline`). Never torch, the job's
code (only the sweep folder's layout and the outcome enums, `pipeline.contract`) or the store's files.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `measure`,
`tracking`, `home`, `contract.sweepdir`, `contract.outcome`; never torch, deepspeed, transformers,
peft, bitsandbytes, submitit, hydra, sqlite3, sqlalchemy.
"""
