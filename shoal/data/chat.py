"""Chat messages -> text segments, trained on or not, through the tokenizer's own chat template.

The template is the Jinja `chat_template` of the tokenizer_config.json beside the tokenizer.json (what
transformers' apply_chat_template renders). The loss covers what the assistant says: for each
assistant message, the conversation up to it is rendered with the generation prompt (not trained:
the user's turns, the system prompt and the template's own markup before the reply) and then with
the reply (trained: its content and the template's end-of-turn markup, so the model learns to stop).
This needs a template whose renderings of a conversation's prefixes are prefixes of each other, as
ChatML, Llama 3 and Mistral's are; one that is not is refused rather than mis-masked.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from shoal.errors import UserError

TOKENIZER_CONFIG = "tokenizer_config.json"


def chat_template(tokenizer_path: str) -> tuple[str, dict] | None:
    """(template, its special tokens) from the tokenizer_config.json beside a tokenizer.json, or None."""
    path = Path(tokenizer_path).with_name(TOKENIZER_CONFIG)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(template, str):
        return None
    tokens = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in config.items() if k.endswith("_token")}
    return template, {k: v for k, v in tokens.items() if isinstance(v, str)}


@lru_cache(maxsize=4)
def _compiled(template: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):  # what transformers gives templates to refuse a conversation
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def render(template: tuple[str, dict] | None, messages: tuple[dict, ...], where: str) -> tuple[tuple[str, bool], ...]:
    """The conversation as (text, trained) segments; `where` names the record in messages."""
    from jinja2.exceptions import TemplateError

    if template is None:
        raise UserError("data.tokenizer", where, "chat messages need the tokenizer's chat template: put a "
                                                 f"{TOKENIZER_CONFIG} with chat_template beside the tokenizer.json, "
                                                 "or give prompt and completion")
    text, tokens = template
    try:
        compiled = _compiled(text)
    except TemplateError as e:  # a hand-edited template that does not parse: jinja's syntax error was a traceback
        raise UserError("data.tokenizer", where, f"the chat template in the {TOKENIZER_CONFIG} beside the "
                                                 f"tokenizer.json does not parse ({e}); fix it, or give prompt and "
                                                 "completion") from None

    def rendered(upto: int, prompt: bool) -> str:
        try:
            return compiled.render(messages=list(messages[:upto]), add_generation_prompt=prompt, **tokens)
        except TemplateError as e:
            raise UserError("data.path", where, f"the chat template refuses this conversation ({e})") from None

    segments, done = [], ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, after = rendered(i, True), rendered(i + 1, False)
        if not (before.startswith(done) and after.startswith(before)):
            raise UserError("data.tokenizer", where, "the chat template renders a conversation's start differently "
                                                     "once it goes on, so the reply cannot be masked; give prompt "
                                                     "and completion instead")
        segments += [(before[len(done):], False), (after[len(before):], True)]
        done = after
    if not any(trained and t for t, trained in segments):
        raise UserError("data.path", where, "the conversation has no assistant message to train on")
    return tuple(s for s in segments if s[0])
