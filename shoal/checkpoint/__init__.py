"""Saving and resuming training: sharded, async, atomic, any layout. See docs/checkpointing.md.

    checkpointer.py  the trainer's Checkpointer: resume before the loop, save after steps (async optional)
    state.py         what a checkpoint holds: model + optimizer + RNG tensors keyed by parameter name
    store.py         on disk: temporary name, manifest with SHA-256, atomic commit, discovery, retention
    choose.py        where checkpoints live and which one a run starts from (--resume); no torch
    safe_read.py     reading DCP's index without unpickling code
    export.py        one-process consolidation: `shoal ckpt inspect` and `shoal ckpt export --hf`
    weights.py       the final model of a run (safetensors + JSON), what `shoal generate` loads
"""
