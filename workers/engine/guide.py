"""Guided decoding: JSON mode (`json_object`), structured outputs (`json_schema`) and the
calls of forced tools, by llguidance (github.com/guidance-ai/llguidance).

A guided sequence holds a `Guide`: an llguidance matcher of its grammar over its tokenizer's
vocabulary. Before each sampling step the batch's guided rows get their masks of allowed
tokens together (`guide_masks`); each token sampled advances the matcher. EOS is allowed only
where the document may end. Schemas are compiled by llguidance's own JSON-schema support:
structure, types, `required`, `enum`/`const`, `anyOf`/`oneOf`/`allOf`, `$ref`s, `pattern`,
`format`, string lengths, number ranges and item counts are all enforced; what it cannot
compile is an `InvalidRequest` naming `response_format`.

Two choices of ours on top: the JSON is compact, with no blanks between its tokens and `,`
and `:` as separators (a model allowed blanks may idle in them until max_tokens cuts the
document: a tool call or an answer needs the tokens of its compact JSON, no more), and an
object schema that lists `properties` without saying
anything of `additionalProperties` gets no others (as OpenAI's strict mode requires them
to say, and as a guided model should not invent keys).
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance
import numpy as np
import torch
from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par

if TYPE_CHECKING:  # a TypedDict of llguidance's stubs only
    from llguidance._lib import JsonCompileOptions

from workers.engine.errors import InvalidRequest

MAX_GRAMMARS = 64  # compiled grammars kept per tokenizer
# Masks over a large vocabulary are filled on llguidance's threads, a row each; over a small
# one (the presets' 261 ids) handing rows to threads costs more than filling them here.
PARALLEL_MIN_TOKENS = 32_768
# llguidance's JSON options: compact (no blanks between tokens); "\u00e9" as well as "é" in
# free strings.
OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
    "json_allow_general_unicode_escapes": True,
}
ANY_OBJECT = {"type": "object"}
# Keywords whose value is a map of names to schemas, or one schema, or a list of schemas.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


class _Vocabulary:
    """One tokenizer's llguidance view (expensive to build: kept per tokenizer and EOS set) and
    the grammars compiled over it, each as a matcher that sequences copy."""

    def __init__(self, tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        try:
            self.ll_tokenizer = llguidance.LLTokenizer(
                tokenizer.to_json(), eos_token=list(eos_token_ids) or None
            )
        except (ValueError, RuntimeError) as exc:
            raise InvalidRequest(
                f"This model's tokenizer cannot be guided: {exc}", param="response_format"
            ) from None
        self.num_tokens = self.ll_tokenizer.vocab_size
        self.eos_token_ids = eos_token_ids
        self.matchers: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()

    def matcher(self, kind: str, schema_text: str) -> llguidance.LLMatcher:
        key = (kind, schema_text)
        template = self.matchers.get(key)
        if template is None:
            grammar = _grammar(kind, schema_text)
            error = llguidance.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
            if error:
                raise _refused(error)
            template = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
            error = template.get_error()
            if error:
                raise _refused(error)
            if len(self.matchers) >= MAX_GRAMMARS:
                self.matchers.popitem(last=False)
            self.matchers[key] = template
        self.matchers.move_to_end(key)
        return template.deep_copy()


def _refused(message: str) -> InvalidRequest:
    message = " ".join(message.split())
    return InvalidRequest(
        f"This model's engine cannot enforce that schema: {message[:500]}", param="response_format"
    )


def _grammar(kind: str, schema_text: str) -> str:
    schema = ANY_OBJECT
    if kind == "json_schema":
        try:
            schema = json.loads(schema_text or "{}")
        except ValueError:
            raise InvalidRequest("guide_schema must be JSON", param="response_format") from None
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            schema_closed(schema), defaults=OPTIONS
        )
    except (ValueError, TypeError) as exc:
        raise _refused(str(exc)) from None


def schema_closed(schema, *, is_open: bool = False):
    """The schema with `additionalProperties: false` wherever an object schema lists its
    properties and says nothing of others. The branches of an `allOf` stay open (each names
    only its part of the object), their own subschemas do not."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: schema_closed(sub) for name, sub in out[key].items()}
    for key in SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = schema_closed(out[key])
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [schema_closed(sub, is_open=key == "allOf") for sub in out[key]]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not is_open
        and "allOf" not in out
    ):
        out["additionalProperties"] = False
    return out


class Guide:
    """One sequence's matcher. A token its grammar refuses (one forced in, e.g. from a resumed
    request's output) leaves the matcher broken and the sequence unconstrained."""

    __slots__ = ("matcher", "vocabulary")

    def __init__(self, vocabulary: _Vocabulary, matcher: llguidance.LLMatcher) -> None:
        self.vocabulary, self.matcher = vocabulary, matcher

    @property
    def is_active(self) -> bool:
        return not self.matcher.is_error()

    @property
    def is_complete(self) -> bool:
        """The output so far is a whole document (EOS may come)."""
        return self.is_active and self.matcher.is_accepting()

    def advance(self, token_id: int) -> None:
        if token_id in self.vocabulary.eos_token_ids or not self.is_active:
            return
        self.matcher.consume_token(token_id)

    def allowed(self) -> torch.Tensor | None:
        """A mask over the tokenizer's ids; None: unconstrained."""
        return guide_masks([self], self.vocabulary.num_tokens)[0] if self.is_active else None


def guide_masks(guides: list[Guide], num_columns: int) -> torch.Tensor:
    """The tokens each (active) guide allows next, one boolean row per guide [len(guides),
    num_columns]; columns past the tokenizer's ids (a model's padded vocabulary) are never
    allowed. One tokenizer for all: an engine's."""
    num_tokens = guides[0].vocabulary.num_tokens
    bits = np.zeros((len(guides), (num_tokens + 31) // 32), dtype=np.int32)
    if len(guides) > 1 and num_tokens >= PARALLEL_MIN_TOKENS:
        fill_next_token_bitmask_par(
            _executor(), [(g.matcher, i) for i, g in enumerate(guides)], bits
        )
    else:
        for i, guide in enumerate(guides):
            fill_next_token_bitmask(guide.matcher, bits, i)
    masks = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
    masks = masks[:, : min(num_tokens, num_columns)]
    if masks.shape[1] < num_columns:
        masks = np.pad(masks, ((0, 0), (0, num_columns - masks.shape[1])))
    return torch.from_numpy(masks.view(bool))


_executors: list[llguidance.LLExecutor] = []


def _executor() -> llguidance.LLExecutor:
    if not _executors:
        _executors.append(llguidance.LLExecutor())
    return _executors[0]


# tokenizer -> {eos ids: _Vocabulary}
_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def guide_start(tokenizer, eos_token_ids: tuple[int, ...], params) -> Guide:
    """A guided sequence's guide: JSON mode, or a schema's (compiled once per tokenizer)."""
    if tokenizer is None:
        raise InvalidRequest("JSON mode needs a model with a tokenizer", param="response_format")
    per_eos = _vocabularies.setdefault(tokenizer, {})
    vocabulary = per_eos.get(eos_token_ids)
    if vocabulary is None:
        vocabulary = per_eos[eos_token_ids] = _Vocabulary(tokenizer, eos_token_ids)
    guide = Guide(vocabulary, vocabulary.matcher(params.guide, params.guide_schema))
    for token_id in params.guide_prefix:  # a resumed request: the output it already has
        guide.advance(token_id)
    return guide
