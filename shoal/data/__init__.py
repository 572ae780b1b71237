"""Data for the trainer: text in, deterministic DP-sharded token batches out.

    tokenizer.py  ByteTokenizer (default, no download) and HFTokenizer (a tokenizer.json)
    tokenizer_files.py  the tokenizer's files, copied into every folder that holds the model
    sources.py    what a data path means: the stdlib corpus, a file, a glob, a directory, JSONL
    shards.py     tokenize once into a memory-mapped cache file with a held-out split
    loader.py     TokenLoader (stateful, resumable, sharded by data-parallel rank) and eval_batches

Nothing is re-exported here so that importing one module does not pull in the others (torch).
"""
