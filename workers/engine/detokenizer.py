"""Incremental detokenisation: text deltas from a growing list of token ids.

A UTF-8 character split across byte tokens is held back until its last byte arrives (as vLLM's
incremental detokenizer does), so a stream never shows a broken character. U+FFFD appears only
for bytes that can never complete: an invalid byte (shown as soon as it is known to be invalid)
or an unfinished character at the very end of the output.

Tokenizers with a byte-level decoder (the presets, GPT-2, Qwen2, LLaMA 3) are detokenised on
bytes with Python's incremental UTF-8 decoder, which tells "not finished yet" from "never
valid". Others (SentencePiece and friends) fall back to decoding a short window of ids and
waiting while it ends in U+FFFD.
"""

from __future__ import annotations

import codecs

from workers.engine.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """``step(ids)`` returns the text the ids added since the last call (the prompt excluded)."""

    __slots__ = ("_tokenizer", "_table", "_decoder", "_prefix_offset", "_read_offset")

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._table = tokenizer.token_bytes_table()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._read_offset = len(prompt_ids)
        # Text mode decodes from a few tokens back, so merges across the boundary render right.
        self._prefix_offset = max(self._read_offset - 5, 0)

    def step(self, ids: list[int], *, is_last: bool = False) -> str:
        """Text added by the newest ids; an unfinished character waits unless ``is_last``."""
        if self._table is not None:
            return self._bytes_step(self._table, ids, is_last)
        return self._text_step(ids, is_last)

    def _bytes_step(self, table: list[bytes], ids: list[int], is_last: bool) -> str:
        size = len(table)
        data = b"".join(table[i] for i in ids[self._read_offset :] if i < size)
        self._read_offset = len(ids)
        return self._decoder.decode(data, final=is_last)

    def _text_step(self, ids: list[int], is_last: bool) -> str:
        prefix = self._tokenizer.decode(ids[self._prefix_offset : self._read_offset])
        full = self._tokenizer.decode(ids[self._prefix_offset :])
        if len(full) > len(prefix) and (is_last or not full.endswith(REPLACEMENT)):
            self._prefix_offset, self._read_offset = self._read_offset, len(ids)
            return full[len(prefix) :]
        return ""
