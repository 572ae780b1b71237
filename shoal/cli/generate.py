"""`shoal generate RUN_DIR [--prompt TEXT] [--tokens N]`: sample text from a trained model, streamed."""

from __future__ import annotations

import sys
from pathlib import Path

from shoal.cli.argtypes import non_empty, nonnegative_float, nonnegative_int, positive_int


def register(sub) -> None:
    p = sub.add_parser("generate", help="sample text from a model saved by `shoal train`")
    p.add_argument("model_dir", type=non_empty("runs/first"), help="a `shoal train --out` directory (or its model/ subdirectory)")
    p.add_argument("--prompt", default="def ", help="text to continue (not empty)")
    p.add_argument("--tokens", type=positive_int, default=200,
                   help="tokens to generate, at most the model's max_seq_len (printed as they are made)")
    p.add_argument("--temperature", type=nonnegative_float, default=0.8, help="0 for greedy decoding")
    p.add_argument("--top-k", type=nonnegative_int, default=40, help="sample among the k likeliest tokens; 0: all")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.checkpoint.weights import load_weights
    from shoal.data.tokenizer import load_tokenizer
    from shoal.errors import UserError
    from shoal.train.generate import stream_text

    if not args.prompt:
        raise UserError("--prompt", args.prompt, "give some text to continue, e.g. --prompt 'def '")
    if args.seed > 2**32 - 1:
        raise UserError("--seed", args.seed, "must be at most 2**32-1")
    model, cfg, tokenizer_spec = load_weights(Path(args.model_dir))
    if args.tokens > cfg.max_new_tokens:
        raise UserError("--tokens", args.tokens, f"at most the model's max_seq_len={cfg.max_new_tokens} per call")
    tokenizer = load_tokenizer(tokenizer_spec)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise UserError("model_dir", args.model_dir, f"is damaged (its tokenizer has token ids up to "
                                                     f"{tokenizer.vocab_size - 1}, the model {cfg.vocab_size}); train again")
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise UserError("--prompt", args.prompt, "encodes to no tokens; give some text to continue")
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    for piece in stream_text(model, tokenizer, prompt_ids, args.tokens, temperature=args.temperature,
                             top_k=args.top_k, seed=args.seed):
        sys.stdout.write(piece)
        sys.stdout.flush()  # a person watching sees each token as it is made
    sys.stdout.write("\n")
    return 0
