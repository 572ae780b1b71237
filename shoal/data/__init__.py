"""Data for the trainer: corpora in, deterministic DP-sharded token batches out.

    tokenizer.py        ByteTokenizer (default, no download) and HFTokenizer (a tokenizer.json)
    tokenizer_files.py  the tokenizer's files, copied into every folder that holds the model
    sources.py          what a data path means: the stdlib corpus, files, globs, directories, by format
    readers.py          documents out of one file: text, JSONL/JSON, parquet, Arrow, compressed or not
    chat.py             fine-tuning chat messages through the tokenizer's chat template
    dataset.py          the prepared format on disk: manifest, shards, records, checks
    prepare.py          `shoal data prepare`: files -> shards, on every core, resumable, in parts
    tokenize_file.py    one file -> one shard (tokens, document ends, loss mask, record): a worker's job
    stream.py           a split's regions across shard files, read as one array without loading it
    permutation.py      the shuffled order of chunks, in constant memory
    corpus.py           what a run trains on: data.path or data.mix, opened or prepared into the cache
    loader.py           TokenLoader (mixtures, document indices, loss masks; resumable, sharded by
                        data-parallel rank) and eval_batches

Nothing is re-exported here so that importing one module does not pull in the others (torch).
"""
