"""Tokenizers: loading a checkpoint's tokenizer.json, and the byte-level one of the presets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import jinja2
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# Special tokens of the byte-level preset tokenizer, then the 256 byte symbols.
PRESET_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
PRESET_VOCAB_SIZE = len(PRESET_SPECIAL_TOKENS) + 256
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer_build() -> HFTokenizer:
    """A byte-level BPE without merges: every UTF-8 byte is one token, like GPT-2's alphabet."""
    vocab = {token: i for i, token in enumerate(PRESET_SPECIAL_TOKENS)}
    for _, symbol in sorted(_bytes_to_unicode().items()):
        vocab[symbol] = len(vocab)
    tokenizer = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in PRESET_SPECIAL_TOKENS])
    return tokenizer


def byte_tokenizer_write(path: Path, *, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json (with a ChatML template) into ``path``."""
    byte_tokenizer_build().save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "model_max_length": model_max_length,
        "chat_template": CHATML_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-symbol map: printable bytes stand for themselves, the rest for 256 + n."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=False))


class Tokenizer:
    """A checkpoint's tokenizer: tokenizer.json plus what tokenizer_config.json says about it."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        self._tokenizer = HFTokenizer.from_file(str(path / "tokenizer.json"))
        config_path = path / "tokenizer_config.json"
        self.config: dict[str, Any] = (
            json.loads(config_path.read_text()) if config_path.exists() else {}
        )
        self.chat_template: str | None = self.config.get("chat_template")
        self.bos_token_id = self._token_id(self.config.get("bos_token"))
        self.eos_token_id = self._token_id(self.config.get("eos_token"))
        self.is_bos_added = bool(self.config.get("add_bos_token", False))
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self._bytes_table: list[bytes] | None | Literal[False] = False  # False: not built yet

    def _token_id(self, token: Any) -> int | None:
        if isinstance(token, dict):  # {"content": "<s>", ...} in older configs
            token = token.get("content")
        return None if token is None else self._tokenizer.token_to_id(token)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        if (
            add_special_tokens
            and self.is_bos_added
            and self.bos_token_id is not None
            and (not ids or ids[0] != self.bos_token_id)
        ):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def to_json(self) -> str:
        """tokenizer.json as Hugging Face's tokenizers writes it (guided decoding builds its own
        view of the vocabulary from it, special tokens included)."""
        return self._tokenizer.to_str()

    def token_bytes_table(self) -> list[bytes] | None:
        """Each id's UTF-8 bytes as ``decode(skip_special_tokens=True)`` renders them, or None.

        Only for byte-level decoders (every token spells bytes); special tokens are b"".
        """
        if self._bytes_table is False:
            self._bytes_table = _bytes_table(self._tokenizer)
        return self._bytes_table

    @property
    def template_has_tools(self) -> bool:
        """Whether the chat template renders tools itself (Hugging Face's `tools` variable)."""
        return bool(self.chat_template and "tools" in self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> str:
        """Render chat messages with the checkpoint's Jinja template (Jinja2 ships with torch),
        with `tools` (OpenAI's function definitions) for templates that render them."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        env = jinja2.Environment(undefined=jinja2.StrictUndefined)
        return env.from_string(self.chat_template).render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.config.get("bos_token") or "",
            eos_token=self.config.get("eos_token") or "",
        )


def _bytes_table(tokenizer: HFTokenizer) -> list[bytes] | None:
    if json.loads(tokenizer.to_str()).get("decoder", {}).get("type") != "ByteLevel":
        return None
    symbol_to_byte = {symbol: byte for byte, symbol in _bytes_to_unicode().items()}
    added = tokenizer.get_added_tokens_decoder()
    table = [b""] * tokenizer.get_vocab_size(with_added_tokens=True)
    for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        if token_id >= len(table):
            table.extend([b""] * (token_id + 1 - len(table)))
        if token_id in added and added[token_id].special:
            continue
        if token_id not in added and all(c in symbol_to_byte for c in token):
            table[token_id] = bytes(symbol_to_byte[c] for c in token)
        else:  # an added (non-special) token renders as its own text
            table[token_id] = tokenizer.decode([token_id], skip_special_tokens=True).encode()
    return table
