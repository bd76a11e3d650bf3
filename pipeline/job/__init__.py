"""Inside the job, on every rank: the job's entry and its callable (`entry`, `task`), the attempt's
life (`attempt`: requeue, stop records, the outcome), what an attempt measures (`runner`), the
outcome decision (`results`, pure), the drills (`drills`, `reshape`) and the distributed
environment (`distributed`). What it shares with the login node (the spec, the point and sweep
folders, the records, accounting) is `pipeline.contract`'s.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import
`contract`, `drills`, `train`, `measure`, `tracking`, `sched`, `data`, `config.schema`,
`config.pretrained`, `config.resolved`, `config.validate`, `home`, `files`, `logs`; never hydra.
"""
