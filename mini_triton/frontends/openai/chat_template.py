"""Chat messages → one prompt.

A model folder (or its version folder) that carries a Hugging Face
`tokenizer_config.json` with a `chat_template` has its messages rendered by that
template, as `transformers`' `apply_chat_template(..., add_generation_prompt=True)`
does: a sandboxed Jinja2 environment with `messages`, `bos_token`, `eos_token`,
`add_generation_prompt` and `raise_exception`. Without one, the plain template: each
message on a line of its own as `role: content`, then `assistant:`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ...core.errors import internal, invalid_arg

log = logging.getLogger("mini_triton.openai")

TOKENIZER_CONFIG = "tokenizer_config.json"
# A template file this large is not a chat template.
MAX_CONFIG_BYTES = 8 * 1024 * 1024


def plain_prompt(messages: list[dict]) -> str:
    """The documented template for models without a tokenizer config."""
    lines = [f"{m['role']}: {text_of(m.get('content'))}" for m in messages]
    return "\n".join(lines + ["assistant:"])


def text_of(content) -> str:
    """A message's content as text: a string, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


@dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer config's chat template and the special tokens it may name."""

    source: str
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: list[dict]) -> str:
        try:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise internal("this model's chat template needs Jinja2 (pip install jinja2)") \
                from None
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
        try:
            template = environment.from_string(self.source)
            return template.render(messages=messages, add_generation_prompt=True,
                                   bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as error:
            raise invalid_arg(f"the model's chat template refused the messages: {error}") \
                from None


def _raise(message: str):
    from jinja2 import TemplateError

    raise TemplateError(message)


def find_template(folders: list[Path]) -> ChatTemplate | None:
    """The chat template of the first folder with a tokenizer config that has one."""
    for folder in folders:
        path = folder / TOKENIZER_CONFIG
        if not path.is_file():
            continue
        try:
            if path.stat().st_size > MAX_CONFIG_BYTES:
                raise ValueError("file too large")
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            log.warning("ignoring %s: %s", path, error)
            continue
        template = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
        if isinstance(template, str):
            return ChatTemplate(template, _token(config.get("bos_token")),
                                _token(config.get("eos_token")))
    return None


def _token(value) -> str:
    """A special token as tokenizer configs write it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
