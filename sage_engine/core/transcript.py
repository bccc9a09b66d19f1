"""The run's output so far: its ids, its stopping rules (EOS, token budget, stop strings) and its text, decoded
step by step in short windows only when a consumer asks for a step's text."""

from __future__ import annotations

import functools
from collections.abc import Callable

from transformers.tokenization_utils_base import PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import TokenizersBackend


def text_decoder(tokenizer) -> Callable[[list[int]], str]:
    """ids -> text as `tokenizer.decode(ids, skip_special_tokens=True)` gives it. Where that call is only the Rust
    tokenizer's own decode (a `tokenizers`-backed tokenizer with transformers' own decode, no clean-up of spaces), the
    Rust decode is called directly (a third of the time), and the transcript decodes up to four short windows a
    step."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    cls = type(tokenizer)
    plain = cls.decode is PreTrainedTokenizerBase.decode and getattr(cls, "_decode", None) is TokenizersBackend._decode
    if plain and backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True)


class Transcript:
    """The output so far, with the stopping rules: EOS, token budget, stop strings. Its text is decoded when first
    asked for (`texts`), step by step in order: a consumer that reads no step's text (the benchmark) never pays for it,
    as transformers' generate() decodes only for a streamer."""

    def __init__(self, tokenizer, eos: set[int], budget: int, stop: tuple[str, ...]):
        self.eos, self.budget, self.stop = eos, budget, tuple(s for s in stop if s)
        self.decode = text_decoder(tokenizer)
        self.ids: list[int] = []
        self.text = ""  # the text of the steps decoded so far
        self.finish_reason: str | None = None
        self._prefix = self._read = 0  # incremental detokenisation window: ids[_prefix:] is re-decoded
        # per step: ids after its drafted tokens, ids after it, did it draft, was it the run's last; appended after its
        # ids, so that another thread reading the texts (the app's) never sees a step whose ids are not there yet
        self._marks: list[tuple[int, int, bool, bool]] = []
        self._texts: list[tuple[str, str]] = []  # per decoded step: (text of its drafted tokens, of the rest)

    def extend(self, tokens: list[int], drafted: int = 0) -> tuple[list[int], int]:
        """Append what a step produced (its first `drafted` tokens from the draft, the rest the target's own),
        truncated by the stopping rules; returns (ids added, the step's index for `texts`)."""
        take = tokens[: max(0, self.budget - len(self.ids))]
        if self.eos and not self.eos.isdisjoint(take):  # cut after the first end-of-sequence token
            take = take[: next(i for i, tok in enumerate(take) if tok in self.eos) + 1]
            self.finish_reason = "eos"
        if self.stop:
            take = self._cut_at_stop(take)
        if len(self.ids) + len(take) >= self.budget and self.finish_reason is None:
            self.finish_reason = "length"
        start = len(self.ids)
        self.ids += take
        self._marks.append((start + min(drafted, len(take)), start + len(take), drafted > 0, self.finished))
        return take, len(self._marks) - 1

    def step_text(self, step: int) -> str:
        """The text step `step` added."""
        return "".join(self.texts(step))

    def drafted_text(self, step: int) -> str:
        """The start of it that the step's accepted draft tokens wrote."""
        return self.texts(step)[0]

    def texts(self, step: int) -> tuple[str, str]:
        """(text of step `step`'s drafted tokens, text of the rest of it), decoding the steps up to it in order. A
        character whose bytes are split between tokens is given with the token that completes it."""
        while len(self._texts) <= step:
            drafted_end, end, drafted, last = self._marks[len(self._texts)]
            from_draft = self._new_text(drafted_end, last) if drafted else ""
            self._texts.append((from_draft, self._new_text(end, last)))
        return self._texts[step]

    def _new_text(self, end: int, last: bool) -> str:
        """Text of ids[_read:end], decoding only a short window (the previous chunk gives context); `last`: of the
        run's final step (a split character is not waited for)."""
        ids = self.ids
        before = self.decode(ids[self._prefix : self._read])
        window = self.decode(ids[self._prefix : end])
        if window.endswith("\ufffd") and not last:
            return ""  # an unfinished multi-byte character: wait for the next tokens
        self._prefix, self._read = self._read, end
        if window.startswith(before):
            added = window[len(before) :]
            self.text += added
            return added
        full = self.decode(ids[:end])  # bytes regrouped across the window edge: resynchronise
        added = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text = full
        return added

    def _cut_at_stop(self, take: list[int]) -> list[int]:
        for j in range(1, len(take) + 1):
            tail = self.decode(self.ids + take[:j])[-(max(map(len, self.stop)) + 64) :]
            if any(s in tail for s in self.stop):
                self.finish_reason = "stop_string"
                return take[:j]
        return take

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
