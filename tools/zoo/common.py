"""What both zoo builders train with: a fresh model, the one training loop, saving, determinism, and
the :class:`Sampler` they draw training pairs through (:mod:`tools.zoo.build` for the arith zoo,
:mod:`tools.zoo.multitask` for the multi-task zoo v3)."""

from __future__ import annotations

import math
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agents.zoo.specs import Model3Spec, ModelSpec

N_POSITIONS = 640  # room for the longest protocol prompt plus a runaway 256-token answer
#: Each pair of a context batch is within this many tokens of the first one's length (little padding).
SIMILAR_TOKENS = 24

Pair = tuple[list[int], list[int]]
_OWN_RE = re.compile(r"Your previous answer: (.*?)\n(?:Considering the other answers|Review it)", re.DOTALL)


def own_previous_answer(text: str) -> str | None:
    """The model's own previous answer quoted in a revision prompt (debate, refine), else ``None``: what a
    *stubborn* zoo model is trained to repeat."""
    own = _OWN_RE.search(text)
    return own.group(1).strip() if own else None


def set_determinism(seed: int) -> None:
    """One torch thread, the seed, deterministic algorithms: the same seed gives the same weights whatever
    ``--jobs`` is."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


def new_model(spec: ModelSpec | Model3Spec, seed: int):
    """A fresh character-level GPT-2 of ``spec``'s shape (no dropout), initialised from ``seed``, and its tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from agents.tiny import char_tokenizer

    tok = char_tokenizer()
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=N_POSITIONS, n_embd=spec.n_embd, n_layer=spec.n_layer, n_head=spec.n_head,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config), tok


class Sampler:
    """Draws training pairs (prompt ids, target ids) from ``rng``; a builder's subclass says which
    prompts and targets. Prompts are rendered with the tokenizer's chat template and keep their last
    ``prompt_tokens`` tokens; targets end with the end-of-sequence token."""

    def __init__(self, tok: Any, rng: random.Random, *, prompt_tokens: int):
        self.tok, self.rng, self.prompt_tokens = tok, rng, prompt_tokens
        self._cache: dict[str, list[int]] = {}

    def _ids(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            if len(self._cache) < 300_000:
                self._cache[text] = ids
        return ids

    def _pair(self, messages: Sequence[dict[str, str]], target: str) -> Pair:
        prompt = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self._ids(prompt)[-self.prompt_tokens:], self._ids(target) + [self.tok.eos_token_id]

    def similar_batch(self, first: Pair, draw: Callable[[], Pair | None], tokens: int) -> list[Pair]:
        """``first`` and more pairs from ``draw()`` (``None``: nothing this time) of about its length
        (:data:`SIMILAR_TOKENS`), about ``tokens`` tokens in all; gives up after 20 draws per pair wanted."""
        width = len(first[0]) + len(first[1])
        pairs, want, tries = [first], max(1, tokens // width), 0
        while len(pairs) < want and tries < 20 * want:
            tries += 1
            pair = draw()
            if pair is not None and abs(len(pair[0]) + len(pair[1]) - width) <= SIMILAR_TOKENS:
                pairs.append(pair)
        return pairs


def optimize(model, tok, *, steps: int, learning_rate: float, warmup: int, draw, label: str, log_every: int,
             log_first: bool = False, extra=None, after_step=None) -> tuple[float, list[dict[str, float]]]:
    """The zoo's one training loop (both builders): AdamW, linear warmup then cosine to 5% of the
    learning rate, gradient clipping at 1. ``draw()`` gives each step's (prompt ids, target ids)
    pairs; every ``log_every`` steps (and after the first, with ``log_first``) a log entry, extended
    by ``extra(step)`` and printed after ``label``; ``after_step(steps_done)`` after every step (saving
    checkpoints). Returns the last loss and the log."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01, betas=(0.9, 0.98))
    t0 = time.perf_counter()
    log: list[dict[str, float]] = []
    loss_value = float("nan")
    for step in range(steps):
        scale = min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = learning_rate * scale
        ids, att, labels = batch_tensors(draw(), tok.pad_token_id)
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = float(loss.detach())
        if (step + 1) % log_every == 0 or (log_first and step == 0):
            entry = {"step": step + 1, "loss": round(loss_value, 4), "seconds": round(time.perf_counter() - t0, 1)}
            entry.update(extra(step) if extra else {})
            log.append(entry)
            print(f"{label} " + " ".join(f"{k} {v}" for k, v in entry.items()), file=sys.stderr, flush=True)
        if after_step is not None:
            after_step(step + 1)
    return loss_value, log


def save_model(model, tok, out_dir: Path) -> None:
    """Write a trained zoo model (weights, tokenizer, generation stops) to ``out_dir``."""
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def batch_tensors(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """``(input ids, attention mask, labels)`` of (prompt ids, target ids) pairs, padded on the right; the loss
    is on the targets only."""
    import torch

    width = max(len(p) + len(t) for p, t in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    attention = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (p, t) in enumerate(pairs):
        seq = p + t
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        labels[row, len(p) : len(seq)] = torch.tensor(t)
    return ids, attention, labels


__all__ = ["N_POSITIONS", "Sampler", "own_previous_answer", "set_determinism", "new_model", "optimize", "save_model", "batch_tensors"]
