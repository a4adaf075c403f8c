"""The instruct model's chat template around a message: the prompt a chat model expects.

Introduced in notebook 02 (batching). It belongs to the tokenizer that comes with the
weights, so it lives in `weights/`, below everything that builds prompts (the lab's
workloads, the explorers, the server).
"""

from __future__ import annotations


def chat_prompt(tokenizer, message: str, system: str | None = None) -> str:
    """The instruct model's chat template around one user message (plain text if it has none).
    Notebooks 02 and 05."""
    if getattr(tokenizer, "chat_template", None) is None:
        return message
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": message}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
