"""The instruct model's chat template around a message: the prompt a chat model expects.

Introduced in notebook 02 (batching). It belongs to the tokenizer that comes with the
weights, so it lives in `weights/`, below everything that builds prompts (the lab's
workloads, the explorers, the server). It is the one home of that prompt: `generate_text`
and the server's chat endpoint both build theirs here, so a system message reaches the
model the same way in process and over HTTP.
"""

from __future__ import annotations

from ..errors import LabError


def chat_prompt(tokenizer, message: str, system: str | None = None) -> str:
    """The instruct model's chat template around one user message, after an optional system
    message. A tokenizer with no chat template gets plain text: the system message, a blank
    line, then the user message (never the message alone: the system text is not dropped).
    Notebooks 02 and 05."""
    if not isinstance(message, str):
        raise LabError(f"The message must be text (a str), got {type(message).__name__}.")
    if system is not None and not isinstance(system, str):
        raise LabError(f"The system message must be text (a str) or None, got {type(system).__name__}.")
    if getattr(tokenizer, "chat_template", None) is None:
        return f"{system}\n\n{message}" if system else message
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": message}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
