"""Tiny local language models: a character-level tokenizer with a chat template, and a randomly
initialised GPT-2 saved with ``save_pretrained``. Used by the tests and benchmarks (no hub needed),
and by the zoo builder as its starting point."""

from __future__ import annotations

import string
from pathlib import Path

CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>", "<user>", "<assistant>", "<system>"]
#: Renders only what a small model needs: system text is dropped, each user turn is wrapped.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<user>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<assistant>{{ m['content'] }}<eos>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def char_tokenizer(charset: str = CHARSET, chat_template: str = CHAT_TEMPLATE):
    """A ``PreTrainedTokenizerFast`` with one token per character of ``charset`` plus special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers import decoders as tk_decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in dict.fromkeys(charset):
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = tk_decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        additional_special_tokens=["<user>", "<assistant>", "<system>"],
    )
    tok.chat_template = chat_template
    tok.padding_side = "left"
    return tok


def tiny_gpt2(out_dir: str | Path, *, seed: int = 0, n_layer: int = 2, n_embd: int = 64, n_head: int = 2,
              n_positions: int = 512) -> Path:
    """Save a randomly initialised GPT-2 with :func:`char_tokenizer` to ``out_dir``; return the path."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = char_tokenizer()
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    model = GPT2LMHeadModel(config)
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
