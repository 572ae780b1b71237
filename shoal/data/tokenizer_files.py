"""A tokenizer travels with the model it was trained with: its files are copied into every folder
that holds the model (a run's model/, each checkpoint, a Hugging Face export), so the folder reads
the same from anywhere, moved or not.

The files are Hugging Face's: tokenizer.json, and tokenizer_config.json where the tokenizer came
with one (its special tokens and chat template). An export that has none gets a minimal one naming
the tokenizer class and the end-of-text token, which is what transformers' AutoTokenizer reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from shoal.data.tokenizer import load_tokenizer
from shoal.errors import UserError

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILES = (TOKENIZER, TOKENIZER_CONFIG)
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>")
"""Special tokens that begin a sequence, in the order we look for them (where no tokenizer_config.json says)."""


def copy_tokenizer(spec: str, directory: Path) -> str:
    """Copy the tokenizer `spec` names into `directory`; returns the spec the folder records: "byte",
    or TOKENIZER (a name inside the folder)."""
    if spec == "byte":
        return spec
    source = Path(spec).expanduser()
    for name, path in ((TOKENIZER, source), (TOKENIZER_CONFIG, source.with_name(TOKENIZER_CONFIG))):
        target = Path(directory) / name
        if path.is_file() and path.resolve() != target.resolve():
            shutil.copyfile(path, target)
    return TOKENIZER


def write_hf_tokenizer(spec: str, directory: Path) -> dict[str, int | None]:
    """The tokenizer's files for transformers in `directory` (none for "byte"), made if it is missing;
    returns the special token ids config.json records: {"bos_token_id", "eos_token_id"}. Everything is
    read and checked before anything is written, so a bad tokenizer leaves no folder or file behind."""
    tokenizer = load_tokenizer(spec)
    if spec == "byte":
        return {"bos_token_id": None, "eos_token_id": tokenizer.eos_id}
    own = Path(spec).expanduser().with_name(TOKENIZER_CONFIG)
    if own.is_file():  # the tokenizer's own: its special tokens
        try:
            config = json.loads(own.read_text())
            tokens = {role: _content(config.get(f"{role}_token")) for role in ("bos", "eos")}
        except (ValueError, AttributeError):  # not JSON, or not a JSON object
            raise UserError("data.tokenizer", spec, f"the {TOKENIZER_CONFIG} beside it is not a JSON object; "
                                                    "fix or remove it") from None
    else:  # ours: the end-of-text token training used, and a beginning one where the vocabulary has one
        tokens = {"bos": next((t for t in BOS_CANDIDATES if tokenizer.token_id(t) is not None), None),
                  "eos": tokenizer.token_of(tokenizer.eos_id) if tokenizer.has_eos else None}
    Path(directory).mkdir(parents=True, exist_ok=True)
    copy_tokenizer(spec, directory)
    if not own.is_file():
        (Path(directory) / TOKENIZER_CONFIG).write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", **{f"{role}_token": t for role, t in tokens.items() if t}},
            indent=2) + "\n")
    return {f"{role}_token_id": tokenizer.token_id(t) if t else None for role, t in tokens.items()}


def _content(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or (older files) {"content": ...}."""
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) else None
