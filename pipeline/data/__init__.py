"""The data a run trains on, as files (`tokenfile`): token files (flat binary token ids), text
tokenized once into them with a local tokenizer and cached next to the data, and the checks of
both. Torch-free: the login node checks a point's data before anything is submitted, and the
job's loader (`pipeline.train.data`) reads through it.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `files`;
never torch, deepspeed, transformers, peft, bitsandbytes, mlflow, submitit, hydra.
"""
