"""Token ids in, text out, one token at a time, with stop strings.

Introduced in notebook 09 (serving over HTTP). A token is not always a whole character
(byte-level tokenizers split multi-byte characters), and a stop string may be split over
several tokens; text that may still change is held back until it cannot:

* text ending in half a character (the replacement character "\\ufffd") waits for the rest;
* an ending that is the start of a stop string waits until it either completes the stop
  string (the answer ends before it: the API never returns the stop string) or cannot.

Everything sent, joined, is the final text: `finish` flushes what was held back.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` must wait: the length of its longest ending
    that is the beginning (not the whole) of one of the `stops`; 0 if none.
    Introduced in notebook 09 (serving over HTTP)."""
    return max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)


class TextStream:
    """The text of one answer, token by token: `add(token)` returns the text that is safe to
    send now; `stopped` turns True when a stop string appears. Notebook 09 (serving over HTTP)."""

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer, self.stop = tokenizer, list(stop or [])
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def add(self, token: int) -> str:
        """Append a token; the new text to send (possibly empty)."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        hits = [text.find(s) for s in self.stop if s in text]
        if hits:
            self.stopped = True
            return self._send_up_to(text[: min(hits)])
        if text.endswith(REPLACEMENT):
            return ""
        return self._send_up_to(text[: len(text) - held_back(text, self.stop)])

    def finish(self) -> str:
        """The answer has ended: the rest of the text, held back or not (nothing after a stop string)."""
        if self.stopped:
            return ""
        return self._send_up_to(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _send_up_to(self, text: str) -> str:
        if not text.startswith(self.sent):          # decoding changed text already sent: send nothing more
            return ""
        new, self.sent = text[len(self.sent):], text
        return new
