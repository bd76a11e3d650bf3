"""The data a run trains on, as files (`tokenfile`): token files (flat binary token ids), text
tokenized once into them with a local tokenizer and cached next to the data, and the checks of
both; chat and instruction sets (`chat`: formats to one message list, `render`: the chat
template and the loss mask, `chatset`: tokenized once and cached, fitted to seq_len and split,
`packing`: padded or packed micro-batches). Torch-free: the login node checks a point's data
before anything is submitted, and the job's loader (`pipeline.train.data`) reads through it.
`render` alone imports transformers, inside its functions, for the tokenizer's chat template
(its own rule in tests/unit/test_boundaries.py; still never torch).

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import `files`, `measure.kinds`; never torch, deepspeed, transformers, peft, bitsandbytes, mlflow, submitit, hydra.
"""
