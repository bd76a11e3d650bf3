"""Inside the job, on every rank: the contract with the login node (`spec`, `task`, `pointdir`:
torch-free), the entry and the attempt's life (`entry`, `attempt`: requeue, stop records, the
outcome), what an attempt measures (`runner`), the outcome decision and accounting (`results`,
`accounting`: pure), the drills (`drills`, `reshape`), the distributed environment
(`distributed`) and the GPU inventory (`gpu`). May import `train`, `measure`, `tracking`,
`slurm`, `config.schema` and `config.resolved`; never Hydra's composition or `submit`."""
