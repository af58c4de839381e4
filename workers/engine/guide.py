"""Guided decoding for JSON mode: a sequence may only pick tokens that keep its output a
prefix of a JSON object (RFC 8259, UTF-8), and may end only once the object is closed; with a
schema (schema_guide.py), a prefix of a document of that schema.

The grammar is a byte-level pushdown automaton: `json_step(state, byte)` is the next state or
None. A token is allowed when each of its bytes steps (the vocabulary's bytes in a trie, so
tokens sharing a beginning are checked once); the allowed ids per state are cached, since a
state (mostly "inside a string at this depth") recurs. Whitespace runs are capped and nesting
is bounded, so a guided model cannot stall in blanks or recurse without end.
"""

from __future__ import annotations

import json
import weakref
from functools import lru_cache

import torch

from workers.engine.errors import InvalidRequest

MAX_DEPTH = 32
MAX_BLANKS = 20  # in a row: enough to pretty-print, not to idle
BLANKS = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'"\\/bfnrtu')
LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
FIRST_CONTINUATION = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF),
                      0xF4: (0x80, 0x8F)}

# A state: (stack of "{" / "[", mode, pending bytes, blanks in a row). Modes:
TOP, VALUE, KEY_OR_CLOSE, KEY, COLON, AFTER, FIRST_OR_CLOSE = range(7)
STRING, KEY_STRING, ESCAPE, KEY_ESCAPE, UNICODE, KEY_UNICODE, UTF8, KEY_UTF8 = range(7, 15)
MINUS, ZERO, INT, DOT, FRAC, EXP, EXP_SIGN, EXP_DIGITS, LITERAL, DONE = range(15, 25)
NUMBER_ENDS = {ZERO, INT, FRAC, EXP_DIGITS}
State = tuple[str, int, bytes | int | tuple[int, int, int], int]
START: State = ("", TOP, 0, 0)


def _blank(state: State, byte: int) -> State | None:
    stack, mode, pending, blanks = state
    return (stack, mode, pending, blanks + 1) if blanks < MAX_BLANKS else None


def _closed(stack: str) -> State:
    """A value just ended: what its container expects next."""
    return (stack, AFTER, 0, 0) if stack else ("", DONE, 0, 0)


def _value(stack: str, byte: int) -> State | None:
    """The first byte of a value."""
    if byte in (ord("{"), ord("[")):
        if len(stack) >= MAX_DEPTH:
            return None
        return (stack + chr(byte), KEY_OR_CLOSE if byte == ord("{") else FIRST_OR_CLOSE, 0, 0)
    if byte == ord('"'):
        return (stack, STRING, 0, 0)
    if byte == ord("-"):
        return (stack, MINUS, 0, 0)
    if byte in DIGITS:
        return (stack, ZERO if byte == ord("0") else INT, 0, 0)
    if byte in LITERALS:
        return (stack, LITERAL, LITERALS[byte], 0)
    return None


def _after(stack: str, byte: int) -> State | None:
    """After a value inside a container: a comma, or the container's close."""
    top = stack[-1]
    if byte == ord(","):
        return (stack, KEY if top == "{" else VALUE, 0, 0)
    if byte == ord("}" if top == "{" else "]"):
        return _closed(stack[:-1])
    return None


def _in_string(state: State, byte: int) -> State | None:
    stack, mode, pending, _ = state
    is_key = mode in (KEY_STRING, KEY_ESCAPE, KEY_UNICODE, KEY_UTF8)
    base = KEY_STRING if is_key else STRING
    if mode in (UTF8, KEY_UTF8):  # continuation bytes of one character: (left, lo, hi)
        left, low, high = pending
        if not low <= byte <= high:
            return None
        return (stack, mode, (left - 1, 0x80, 0xBF), 0) if left > 1 else (stack, base, 0, 0)
    if mode in (ESCAPE, KEY_ESCAPE):
        if byte not in ESCAPES:
            return None
        return (stack, KEY_UNICODE if is_key else UNICODE, 4, 0) if byte == ord("u") \
            else (stack, base, 0, 0)
    if mode in (UNICODE, KEY_UNICODE):
        if byte not in HEX:
            return None
        return (stack, mode, pending - 1, 0) if pending > 1 else (stack, base, 0, 0)
    if byte == ord('"'):
        return (stack, COLON, 0, 0) if is_key else _closed(stack)
    if byte == ord("\\"):
        return (stack, KEY_ESCAPE if is_key else ESCAPE, 0, 0)
    if byte < 0x20:  # control characters are escaped in JSON strings
        return None
    if byte < 0x80:
        return state
    # A UTF-8 lead byte (C2-F4): how many continuation bytes follow, and the range of the first
    # (no overlong forms, no surrogates, nothing past U+10FFFF).
    follow = 1 if 0xC2 <= byte <= 0xDF else 2 if 0xE0 <= byte <= 0xEF else \
        3 if 0xF0 <= byte <= 0xF4 else 0
    low, high = FIRST_CONTINUATION.get(byte, (0x80, 0xBF))
    return (stack, KEY_UTF8 if is_key else UTF8, (follow, low, high), 0) if follow else None


def _in_number(state: State, byte: int) -> State | None:
    stack, mode, _, _ = state
    if byte in DIGITS:
        if mode == MINUS:
            return (stack, ZERO if byte == ord("0") else INT, 0, 0)
        if mode in (INT, FRAC, EXP_DIGITS):
            return state
        nxt = {DOT: FRAC, EXP: EXP_DIGITS, EXP_SIGN: EXP_DIGITS}.get(mode)
        return None if nxt is None else (stack, nxt, 0, 0)
    if byte == ord(".") and mode in (ZERO, INT):
        return (stack, DOT, 0, 0)
    if byte in b"eE" and mode in (ZERO, INT, FRAC):
        return (stack, EXP, 0, 0)
    if byte in b"+-" and mode == EXP:
        return (stack, EXP_SIGN, 0, 0)
    if mode not in NUMBER_ENDS or not stack:
        return None
    # The number ended: this byte is what follows it.
    after = _closed(stack)
    return _blank(after, byte) if byte in BLANKS else _after(stack, byte)


def json_step(state: State, byte: int) -> State | None:
    """The automaton's next state after one byte of output, or None if it breaks the JSON."""
    stack, mode, pending, _ = state
    if STRING <= mode <= KEY_UTF8:
        return _in_string(state, byte)
    if MINUS <= mode <= EXP_DIGITS:
        return _in_number(state, byte)
    if mode == LITERAL:
        if byte != pending[0]:
            return None
        return (stack, LITERAL, pending[1:], 0) if len(pending) > 1 else _closed(stack)
    if mode == DONE:
        return None
    if byte in BLANKS:
        return _blank(state, byte)
    if mode == TOP:  # JSON mode answers with an object
        return _value(stack, byte) if byte == ord("{") else None
    if mode == VALUE:
        return _value(stack, byte)
    if mode == FIRST_OR_CLOSE:
        return _closed(stack[:-1]) if byte == ord("]") else _value(stack, byte)
    if mode in (KEY_OR_CLOSE, KEY):
        if byte == ord('"'):
            return (stack, KEY_STRING, 0, 0)
        return _closed(stack[:-1]) if byte == ord("}") and mode == KEY_OR_CLOSE else None
    if mode == COLON:
        return (stack, VALUE, 0, 0) if byte == ord(":") else None
    return _after(stack, byte)  # AFTER


class ObjectGrammar:
    """JSON mode: any JSON object."""

    start = START
    step = staticmethod(json_step)

    @staticmethod
    def is_done(state: State) -> bool:
        return state[1] == DONE


class JsonGuide:
    """A grammar (`start`, `step(state, byte)`, `is_done(state)`) over one tokenizer's
    vocabulary, shared by its engine's sequences. `table` is each token id's bytes (b"" for
    special tokens, which are never allowed)."""

    def __init__(self, table: list[bytes], eos_token_ids: tuple[int, ...], grammar=ObjectGrammar) -> None:
        self.eos_token_ids, self.grammar = eos_token_ids, grammar
        self.trie: dict = {}  # byte -> (children, ids ending here)
        for token_id, data in enumerate(table):
            node = None
            children = self.trie
            for byte in data:
                node = children.setdefault(byte, ({}, []))
                children = node[0]
            if node is not None:
                node[1].append(token_id)
        self.num_tokens = len(table)
        # Masks, not id lists: a large vocabulary's string states allow nearly every token.
        self.allowed = lru_cache(maxsize=512)(self._allowed)

    def allowed_ids(self, state) -> list[int]:
        return self.allowed(state).nonzero().flatten().tolist()

    def _allowed(self, state) -> torch.Tensor:
        """Which ids may come next in `state`, as a mask over the tokenizer's ids (EOS only
        where the document may end)."""
        step = self.grammar.step
        ids: list[int] = list(self.eos_token_ids) if self.grammar.is_done(state) else []
        todo = [(self.trie, state)]
        while todo:
            children, current = todo.pop()
            for byte, (grandchildren, ending) in children.items():
                nxt = step(current, byte)
                if nxt is not None:
                    ids.extend(ending)
                    if grandchildren:
                        todo.append((grandchildren, nxt))
        mask = torch.zeros(max(self.num_tokens, max(ids, default=0) + 1), dtype=torch.bool)
        mask[ids] = True
        return mask

    def advance(self, state, data: bytes):
        for byte in data:
            state = self.grammar.step(state, byte)
            if state is None:
                return None
        return state


class GuideState:
    """One sequence's place in its guide: what may come next, and the step after a token."""

    __slots__ = ("guide", "table", "state")

    def __init__(self, guide: JsonGuide, table: list[bytes], prefix: tuple[int, ...] = ()) -> None:
        self.guide, self.table, self.state = guide, table, guide.grammar.start
        for token_id in prefix:  # a resumed request: the output it already has
            self.advance(token_id)

    def allowed(self) -> torch.Tensor | None:
        """A mask over the tokenizer's ids; None: unconstrained (a token outside the grammar
        was forced in, e.g. a stop id)."""
        return None if self.state is None else self.guide.allowed(self.state)

    def advance(self, token_id: int) -> None:
        if token_id in self.guide.eos_token_ids or self.state is None:
            return
        self.state = self.guide.advance(self.state, self.table[token_id])

    @property
    def is_complete(self) -> bool:
        return self.state is not None and self.guide.grammar.is_done(self.state)


MAX_SCHEMAS = 64  # compiled schema guides kept per tokenizer
_guides: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {key: JsonGuide}


def guide_start(tokenizer, eos_token_ids: tuple[int, ...], params) -> GuideState:
    """A guided sequence's guide: JSON mode, or a schema's (compiled once per tokenizer)."""
    table = tokenizer.token_bytes_table() if tokenizer is not None else None
    if table is None:
        raise InvalidRequest("JSON mode needs a model with a byte-level tokenizer",
                             param="response_format")
    guides = _guides.setdefault(tokenizer, {})
    key = (params.guide, params.guide_schema)
    guide = guides.get(key)
    if guide is None:
        grammar = ObjectGrammar
        if params.guide == "json_schema":
            from workers.engine.schema_guide import SchemaGrammar

            try:
                schema = json.loads(params.guide_schema or "{}")
            except ValueError:
                raise InvalidRequest("guide_schema must be JSON", param="response_format") from None
            grammar = SchemaGrammar(schema)
        if len(guides) >= MAX_SCHEMAS:
            guides.pop(next(iter(guides)))
        guide = guides[key] = JsonGuide(table, eos_token_ids, grammar)
    return GuideState(guide, table, params.guide_prefix)
