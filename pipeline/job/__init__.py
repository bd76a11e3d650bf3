"""Inside the job, on every rank: the contract with the login node (`spec`, `task`, `pointdir`:
torch-free), the entry and the attempt's life (`entry`, `attempt`: requeue, stop records, the
outcome), what an attempt measures (`runner`), the outcome decision and accounting (`results`,
`accounting`: pure), the drills (`drills`, `reshape`), the distributed environment
(`distributed`), the GPU inventory (`gpu`) and the sweep folder (`sweepdir`, torch-free).

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `train`,
`measure`, `tracking`, `slurm`, `data`, `config.schema`, `config.pretrained`, `config.resolved`,
`config.validate`, `home`, `files`, `logs`; never hydra.
"""
