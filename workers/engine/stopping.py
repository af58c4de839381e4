"""When a sequence stops: stop tokens, EOS, stop strings, max_tokens, the context limit."""

from __future__ import annotations

from workers.engine.sequence import FinishReason, Sequence


def stop_check(
    seq: Sequence, token_id: int, eos_token_ids: tuple[int, ...], max_model_len: int
) -> FinishReason | None:
    """Token-level checks, right after ``token_id`` was appended."""
    params = seq.params
    if seq.num_output_tokens >= params.min_tokens:
        if token_id in params.stop_token_ids:
            seq.stop_reason = token_id
            return FinishReason.STOP
        if not params.ignore_eos and token_id in eos_token_ids:
            return FinishReason.STOP
    if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None


def text_update(seq: Sequence, reason: FinishReason | None) -> FinishReason | None:
    """Extend the sequence's text with its newest token and look for stop strings in it."""
    if seq.detokenizer is None:
        return reason
    previous = len(seq.text)
    seq.text += seq.detokenizer.step(seq.token_ids, is_last=reason is not None)
    params = seq.params
    if not params.stop or seq.num_output_tokens < params.min_tokens:
        return reason
    longest = max(len(s) for s in params.stop)
    search_from = max(previous - longest + 1, 0)
    found = [(seq.text.find(s, search_from), s) for s in params.stop]
    found = [(i, s) for i, s in found if i >= 0]
    if not found:
        return reason
    index, stop = min(found)
    seq.text = seq.text[: index + (len(stop) if params.include_stop_str_in_output else 0)]
    seq.stop_reason = stop
    return FinishReason.STOP


def text_delta(seq: Sequence, *, is_finished: bool) -> str:
    """The text not yet streamed, less the last ``len(longest stop) - 1`` characters while running
    (so a stop string is never half-sent); marks it streamed."""
    holdback = 0 if is_finished else max((len(s) for s in seq.params.stop), default=1) - 1
    delta = seq.text[seq.num_text_emitted : len(seq.text) - holdback]
    seq.num_text_emitted += len(delta)
    return delta
