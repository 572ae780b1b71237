"""`shoal data prepare SRC... --tokenizer T --out DIR` and `shoal data info DIR`: tokenize a corpus
once, on every core, into a prepared dataset that runs read with `data.path = DIR` (docs/data.md)."""

from __future__ import annotations

import argparse

from shoal.cli.argtypes import float_at_least, int_at_least, non_empty


def register(sub) -> None:
    p = sub.add_parser("data", help="prepare a corpus once into a sharded token dataset, or describe one")
    cmds = p.add_subparsers(dest="data_command", required=True)
    prep = cmds.add_parser("prepare", help="tokenize files, folders and globs (text, JSONL, parquet, Arrow; "
                                           "gz/zst/bz2/xz) into DIR, in parallel; resumable")
    prep.add_argument("sources", nargs="+", type=non_empty("data/*.jsonl.gz"), metavar="SRC",
                      help='files, folders or globs (quote globs), or "stdlib"')
    prep.add_argument("--tokenizer", default="byte", type=non_empty("tokenizer.json"),
                      help='"byte" (default) or the path of a Hugging Face tokenizer.json')
    prep.add_argument("--out", required=True, type=non_empty("data/prepared"), help="the dataset folder")
    prep.add_argument("--text-field", default="text", type=non_empty("text"),
                      help="the field or column holding the text (JSONL, parquet, Arrow)")
    prep.add_argument("--val-fraction", default=0.01, type=float_at_least(0, strict=True, most=0.99),
                      help="share of documents held out, by a hash of their names (default 0.01)")
    prep.add_argument("--workers", default=0, type=int_at_least(0, "0: every core"),
                      help="processes tokenizing files at once (default: every core)")
    prep.add_argument("--shard", default="0/1", type=_part, metavar="I/N",
                      help="this machine's part when N machines share the work (0/4 ... 3/4); the last to "
                           "finish writes the manifest")
    prep.set_defaults(func=prepare)
    info = cmds.add_parser("info", help="what a prepared dataset holds")
    info.add_argument("path", type=non_empty("data/prepared"))
    info.set_defaults(func=describe)


def _part(text: str) -> tuple[int, int]:
    index, slash, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not slash or n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"expected I/N with 0 <= I < N, e.g. 0/4, got {text!r}")
    return i, n


def prepare(args) -> int:
    from shoal.data.prepare import prepare as run

    done = run(args.sources, args.tokenizer, args.out, text_field=args.text_field, val_fraction=args.val_fraction,
               workers=args.workers, part=args.shard, field="SRC")
    rate = done.input_bytes / 1e6 / max(done.seconds, 1e-9)
    print(f"{done.path}: {done.shards_done} files tokenized ({done.input_bytes / 1e6:,.1f} MB in {done.seconds:.1f} s, "
          f"{rate:.1f} MB/s), {done.shards_kept} already done")
    if not done.complete:
        print(f"part {args.shard[0]}/{args.shard[1]} is done; the manifest is written when the last part finishes")
        return 0
    return describe(argparse.Namespace(path=done.path))


def describe(args) -> int:
    from shoal.data.dataset import open_dataset

    d = open_dataset(args.path, "PATH")
    s = d.settings
    tokens, docs = sum(r.tokens for r in d.shards), sum(r.docs for r in d.shards)
    val = sum(r.val_tokens for r in d.shards)
    print(f"{d.path}: {tokens:,} tokens in {docs:,} documents from {len(d.shards)} files; {val:,} tokens held out "
          f"({s.val_fraction:g} of documents)")
    if examples := sum(r.loss_mask for r in d.shards):
        print(f"{examples} of the files hold fine-tuning examples: the loss is on completions and replies only")
    print(f"tokenizer {d.tokenizer_file or 'byte'} ({s.vocab_size:,} tokens, eos id {s.eos_id}), stored as {d.dtype}; "
          f"train on it with --set data.path={d.path} (the run takes its tokenizer)")
    return 0
