"""`shoal generate RUN_DIR [--prompt TEXT] [--tokens N]`: sample text from a trained model."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("generate", help="sample text from a model saved by `shoal train`")
    p.add_argument("model_dir", help="a `shoal train --out` directory (or its model/ subdirectory)")
    p.add_argument("--prompt", default="def ", help="text to continue")
    p.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.checkpoint.weights import load_weights
    from shoal.data.tokenizer import load_tokenizer
    from shoal.errors import UserError
    from shoal.train.generate import sample

    if args.tokens < 1:
        raise UserError("--tokens", args.tokens, "must be a positive integer")
    model, _, tokenizer_spec = load_weights(Path(args.model_dir))
    tokenizer = load_tokenizer(tokenizer_spec)
    ids = sample(model, tokenizer.encode(args.prompt), args.tokens, temperature=args.temperature,
                 top_k=args.top_k, seed=args.seed, stop_id=tokenizer.eos_id)
    print(args.prompt + tokenizer.decode(ids))
    return 0
