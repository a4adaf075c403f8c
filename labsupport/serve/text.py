"""Token ids in, text out, one token at a time, with stop strings.

Introduced in notebook 09 (serving over HTTP). A token is not always a whole character
(byte-level tokenizers split multi-byte characters), and a stop string may be split over
several tokens; text that may still change is held back until it cannot:

* text ending in half a character (the replacement character "\\ufffd") waits for the rest;
* an ending that is the start of a stop string waits until it either completes the stop
  string (the answer ends before it: the API never returns the stop string) or cannot.

Everything sent, joined, is the final text: `finish` flushes what was held back.

Stop strings are matched as the text grows, by one small automaton per stop string (the
Knuth-Morris-Pratt failure table, built once per request): each new character moves it in
amortized constant time, and its state is the length of the longest ending of the text
that begins the stop string, which is exactly what must be held back. So the work per token
is linear in the new text (times the number of stop strings), however long a stop string or
the answer is; rescanning the whole text for every stop at every token would be quadratic.
"""

from __future__ import annotations

from ..engine.generation import generate
from ..engine.sampling import GREEDY, SamplingConfig
from ..errors import LabError
from ..weights.chat import chat_prompt

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 4      # settled tokens decoded again beside a new one (a byte-level BPE character spans at most 4)


class StopMatcher:
    """One stop string's Knuth-Morris-Pratt automaton. `state` is the length of the longest
    ending of the text fed so far that is a beginning of `stop` (== len(stop): it appeared).
    Introduced in notebook 09 (serving over HTTP)."""

    def __init__(self, stop: str):
        self.stop = stop
        self.fail = [0] * len(stop)        # fail[i]: longest proper border of stop[:i + 1]
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            self.fail[i] = k

    def step(self, state: int, char: str) -> int:
        """The state after one more character."""
        if state == len(self.stop):
            state = self.fail[state - 1]
        while state and char != self.stop[state]:
            state = self.fail[state - 1]
        return state + 1 if char == self.stop[state] else 0


def stop_matchers(stops: list[str] | None) -> list[StopMatcher]:
    """The automaton of each non-empty stop string: built once per request, in linear time.
    Notebook 09 (serving over HTTP)."""
    return [StopMatcher(stop) for stop in stops or [] if stop]


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` must wait: the length of its longest ending
    that is the beginning (not the whole) of one of the `stops`; 0 if none. Reads only the
    last len(stop) - 1 characters, in linear time. Introduced in notebook 09 (serving over HTTP)."""
    longest = 0
    for stop in stops:
        matcher, state = StopMatcher(stop), 0
        for char in text[len(text) - len(stop) + 1:] if len(stop) > 1 else "":
            state = matcher.step(state, char)
        longest = max(longest, state if state < len(stop) else 0)
    return longest


class TextStream:
    """The text of one answer, token by token: `add(token)` returns the text that is safe to
    send now; `stopped` turns True when a stop string appears. Notebook 09 (serving over HTTP)."""

    def __init__(self, tokenizer, stop: list[str] | None = None, matchers: list[StopMatcher] | None = None):
        """stop: the stop strings; or matchers: their automata, built once (`stop_matchers`) and shared
        by every choice of a request (an automaton holds no state of its own)."""
        self.matchers = stop_matchers(stop) if matchers is None else list(matchers)
        self.tokenizer, self.stop = tokenizer, [m.stop for m in self.matchers]
        self.states = [0] * len(self.matchers)
        self.fed = ""                  # the text the matchers have read (none of it can change)
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False
        # the text of ids[:len(ids) at the last whole character], and the few ids before that point
        # (from `context_start`) decoded alone: the next token is decoded with those few as context
        self.settled, self.context_start, self.context_text = "", 0, ""

    def add(self, token: int) -> str:
        """Append a token; the new text to send (possibly empty)."""
        self.ids.append(token)
        text = self._text()
        stable = text.rstrip(REPLACEMENT)               # half a character at the end may still change
        cut = self._feed(stable)
        if cut is not None:
            self.stopped = True
            return self._send_up_to(text[:cut])
        if text.endswith(REPLACEMENT):
            return ""
        return self._send_up_to(text[: len(text) - max(self.states, default=0)])

    def _text(self) -> str:
        """The answer's text so far, decoding only the newest tokens and a few before them
        (`CONTEXT_TOKENS`; vLLM's prefix and read offsets): a token costs the same however long
        the answer is, where decoding every id at every token would be quadratic. When the new
        token changes how its context decodes, the whole answer is decoded once."""
        window = self._decode(self.ids[self.context_start:])
        if window.startswith(self.context_text):
            text = self.settled + window[len(self.context_text):]
        else:
            text = self._decode(self.ids)
        if not text.endswith(REPLACEMENT):              # a whole character: these tokens settle
            self.settled, settled_ids = text, len(self.ids)
            self.context_start = max(0, settled_ids - CONTEXT_TOKENS)
            self.context_text = self._decode(self.ids[self.context_start:settled_ids])
        return text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _feed(self, stable: str) -> int | None:
        """Move the matchers over the characters of `stable` they have not read; where the
        first stop string appears (its start), or None. Linear in the new characters."""
        if not stable.startswith(self.fed):             # decoding changed text already read: reread it
            self.fed, self.states = "", [0] * len(self.matchers)
        for position in range(len(self.fed), len(stable)):
            char = stable[position]
            self.states = [m.step(state, char) for m, state in zip(self.matchers, self.states)]
            done = [len(m.stop) for m, state in zip(self.matchers, self.states) if state == len(m.stop)]
            if done:                                    # the earliest to end; of those, the longest
                self.fed = stable[: position + 1]
                return position + 1 - max(done)
        self.fed = stable
        return None

    def finish(self) -> str:
        """The answer has ended: the rest of the text, held back or not (nothing after a stop string)."""
        if self.stopped:
            return ""
        return self._send_up_to(self._decode(self.ids))

    def _send_up_to(self, text: str) -> str:
        if not text.startswith(self.sent):          # decoding changed text already sent: send nothing more
            return ""
        new, self.sent = text[len(self.sent):], text
        return new


# --- text in, text out, in a notebook ------------------------------------------------

class TextStreamer:
    """A `stream` callback for `generate` that prints text as it is generated (batch 1), through
    the same incremental detokenizer as the server (`TextStream`): a token that is half of a
    character prints with the rest of it.

    It streams notebook 01's `generate` (`generate_text(..., stream=True)`: the README's first example).
    """

    def __init__(self, tokenizer, print_fn=None):
        self.text = TextStream(tokenizer)
        self.print_fn = print_fn or (lambda text: print(text, end="", flush=True))

    def __call__(self, next_tokens) -> None:
        new = self.text.add(int(next_tokens[0]))
        if new:
            self.print_fn(new)


def generate_text(model, tokenizer, message: str, max_new_tokens: int = 64,
                  sampling: SamplingConfig = GREEDY, chat: bool = True, system: str | None = None,
                  stream: bool = False) -> str:
    """Reply to `message` (inside the chat template when `chat`, after the `system` message if
    any: `weights.chat.chat_prompt`, as the server builds its chat prompt), optionally printing
    as it goes. Text in, text out around notebook 01's `generate` (the README's first example)."""
    text = _prompt_text(tokenizer, message, chat, system, stream)
    ids = tokenizer.encode(text, add_special_tokens=False)
    eos = set(model.config.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(tokenizer.eos_token_id)
    result = generate(model, ids, max_new_tokens, sampling, eos_token_ids=sorted(eos),
                      stream=TextStreamer(tokenizer) if stream else None)
    return tokenizer.decode(result.row(0), skip_special_tokens=True)


def _prompt_text(tokenizer, message, chat, system, stream) -> str:
    """`generate_text`'s prompt as text, after checking its arguments (one sentence each)."""
    for name, flag in (("chat", chat), ("stream", stream)):
        if not isinstance(flag, bool):
            raise LabError(f"{name} must be True or False, got {flag!r} ({type(flag).__name__}).")
    if not isinstance(message, str):
        raise LabError(f"The message must be text (a str), got {type(message).__name__}; "
                       f"for token ids, call generate instead.")
    if not chat and system is not None:
        raise LabError("A system message is part of the chat prompt, but chat=False sends the message as it "
                       "is; use chat=True, or put the system text into the message yourself.")
    return chat_prompt(tokenizer, message, system) if chat else message
