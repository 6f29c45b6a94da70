"""Tokenizer over a `tokenizer.json` directory, the ChatML template, and small BPEs for tiny runs.

The chat template is the project's own code, not a Jinja template from the checkpoint: ChatML
(`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`). For
system / user / assistant text messages without `<think>` blocks this is token-identical to the
Qwen2.5 template (given a system message) and the Qwen3 template.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence

import tokenizers
from etils import epath
from tokenizers import decoders, models, pre_tokenizers, trainers

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CHATML_SPECIALS = (ENDOFTEXT, IM_START, IM_END)
# Tags the agent prompts use; whole tokens in a trained BPE so actions parse cheaply (as <think> is in Qwen3).
AGENT_TAGS = ("<think>", "</think>", "<action>", "</action>")

# An equivalent Jinja template, written into tokenizer_config.json so `transformers` agrees.
_CHATML_JINJA = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")


class Tokenizer:
    def __init__(self, tok: tokenizers.Tokenizer, eos_token: str = IM_END,
                 pad_token: str = ENDOFTEXT):
        self.tok = tok
        for name in (IM_START, IM_END):
            if tok.token_to_id(name) is None:
                raise ValueError(f"Tokenizer has no {name} token; the ChatML template needs "
                                 f"{IM_START} and {IM_END} as special tokens.")
        self.eos_token, self.pad_token = eos_token, pad_token
        self.eos_id = tok.token_to_id(eos_token)
        self.pad_id = tok.token_to_id(pad_token)
        if self.eos_id is None or self.pad_id is None:
            raise ValueError(f"Tokenizer lacks eos {eos_token!r} or pad {pad_token!r}.")
        self.im_start_id = tok.token_to_id(IM_START)
        self.im_end_id = tok.token_to_id(IM_END)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        path = epath.Path(path)  # local or remote (gs://...)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"No tokenizer.json at {path}. Point at the checkpoint directory "
                                    "(it must hold tokenizer.json; slow vocab/merges-only "
                                    "tokenizers are not read).")
        config_file = file.parent / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.exists() else {}

        def token(key, default):
            value = config.get(key) or default
            return value["content"] if isinstance(value, Mapping) else value
        return cls(tokenizers.Tokenizer.from_str(file.read_text()),
                   eos_token=token("eos_token", IM_END), pad_token=token("pad_token", ENDOFTEXT))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end a generated turn: <|im_end|> and <|endoftext|>."""
        return tuple(dict.fromkeys((self.im_end_id, self.tok.token_to_id(ENDOFTEXT) or self.eos_id)))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @staticmethod
    def render_chat(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        parts = []
        for m in messages:
            if set(m) - {"role", "content"} or not isinstance(m.get("content"), str):
                raise ValueError(f"Chat messages are {{'role', 'content': str}} dicts; got {m!r}.")
            parts.append(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n")
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
        return "".join(parts)

    def chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def count(self, text_or_messages: str | Sequence[Mapping[str, str]]) -> int:
        if isinstance(text_or_messages, str):
            return len(self.encode(text_or_messages))
        return len(self.chat(text_or_messages, add_generation_prompt=False))

    # ------------------------------------------------------------------ small BPEs for CPU runs

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2,
              extra_tokens: Sequence[str] = AGENT_TAGS, specials: Sequence[str] = ()
              ) -> Tokenizer:
        """Byte-level BPE (as Qwen's) with the ChatML specials at ids 0, 1, 2; `specials` are
        added after the vocabulary (e.g. Qwen2.5-VL's vision tokens for a visual run)."""
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
            special_tokens=list(CHATML_SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        if extra_tokens:
            tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                            for t in extra_tokens])
        if specials:
            tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                                    for t in specials])
        return cls(tok)

    def save(self, path: str | os.PathLike):
        """tokenizer.json + tokenizer_config.json (readable by `transformers` too), local or remote."""
        path = epath.Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "tokenizer.json").write_text(self.tok.to_str(pretty=True))  # as Tokenizer.save
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": self.eos_token,
                  "pad_token": self.pad_token, "bos_token": None, "unk_token": None,
                  "add_bos_token": False, "clean_up_tokenization_spaces": False,
                  "chat_template": _CHATML_JINJA}
        (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        return path
