"""Hugging Face transformers backend: batched, left-padded, KV-cached decoding with per-request seeds.

Why a decoding loop of our own rather than ``model.generate``: ``generate`` draws every row of a
batch from one random stream, so a sampled answer would depend on which other requests share its
batch. Here each request samples from its own ``torch.Generator`` seeded by ``request.sampling.seed``:
the same request gives the same text whatever it is batched with, which is what makes runs
reproducible and coalition results cacheable. The loop is the standard one (one forward over the
left-padded prompts, then one token per step through the model's KV cache).
"""

from __future__ import annotations

import hashlib
import inspect
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agents.base import Agent, Generation, Message, Request, SamplingParams


def _cache_of(output: Any) -> Any:
    """The KV cache of a forward's output (``cache`` in transformers >= 5.x, ``past_key_values`` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def plain_chat_format(messages: Sequence[Message]) -> str:
    """Fallback chat format for tokenizers without a chat template."""
    parts = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(parts) + "\nAssistant:"


class HFAgent(Agent):
    """A transformers causal LM as an :class:`Agent`.

    Args:
        model: a path or hub id, or a loaded ``PreTrainedModel``.
        tokenizer: a tokenizer (loaded from ``model`` when it is a path/id).
        name: display name (default: the path's last component or the config's name).
        device: ``"cpu"``, ``"cuda"``, ...
        dtype: e.g. ``torch.bfloat16``; default float32 on CPU.
        batch_size: the most requests decoded together; requests are sorted by prompt length
            first (length buckets) so padding stays small.

    Example:
        >>> agent = HFAgent("path/to/model")                                  # doctest: +SKIP
        >>> agent.generate([Request([{"role": "user", "content": "2+2?"}])])  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any | None = None,
        *,
        name: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 64,
        trust_remote_code: bool = False,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, (str, Path)):
            source = str(model)
            try:
                loaded = AutoModelForCausalLM.from_pretrained(
                    source, dtype=dtype or torch.float32, trust_remote_code=trust_remote_code
                )
                tokenizer = tokenizer or AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            except OSError as e:
                raise OSError(
                    f"HFAgent could not load {source!r}: not a local model directory and not reachable on the hub "
                    f"({e.__class__.__name__}). Pass a directory written by save_pretrained, or a hub id with network access."
                ) from e
            model = loaded
            default_name = Path(source).name or source
        else:
            if tokenizer is None:
                raise ValueError("HFAgent(model=<loaded model>) also needs tokenizer=")
            default_name = getattr(model.config, "name_or_path", None) or type(model).__name__
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.to(device)
        self.model.eval()
        self.tokenizer = tokenizer
        self.name = name or default_name
        self.device = torch.device(device)
        self.batch_size = batch_size
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.eos_ids = self._eos_ids()
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    # ------------------------------------------------------------------ prompts
    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text of a chat: the tokenizer's chat template, or :func:`plain_chat_format`."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return plain_chat_format(messages)

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]:
        return list(self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ generation
    def _generate(self, requests: list[Request]) -> list[Generation]:
        prompt_ids = [self.encode_prompt(r.messages) for r in requests]
        order = sorted(range(len(requests)), key=lambda i: len(prompt_ids[i]))
        results: list[Generation | None] = [None] * len(requests)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            t0 = time.perf_counter()
            outs = self._decode([prompt_ids[i] for i in chunk], [requests[i].sampling for i in chunk])
            per_request = (time.perf_counter() - t0) / len(chunk)
            for i, (tokens, logprobs, reason) in zip(chunk, outs):
                results[i] = Generation(
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    token_ids=tokens,
                    logprobs=logprobs,
                    finish_reason=reason,
                    prompt_tokens=len(prompt_ids[i]),
                    completion_tokens=len(tokens),
                    prompt_token_ids=prompt_ids[i],
                    seconds=per_request,
                )
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _decode(
        self, prompts: list[list[int]], params: list[SamplingParams]
    ) -> list[tuple[list[int], list[float], str]]:
        batch = len(prompts)
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((batch, width), pad, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, p in enumerate(prompts):
            if p:
                input_ids[row, width - len(p) :] = torch.tensor(p)
                attention[row, width - len(p) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator().manual_seed(int(p.seed or 0) % (2**63)) for p in params]
        temperatures = [p.temperature for p in params]
        limits = [p.max_new_tokens for p in params]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons = ["length"] * batch
        active = [True] * batch

        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
        past = _cache_of(out)
        logits = out.logits[:, -1, :].float()
        for _step in range(max(limits)):
            next_tokens = self._choose(logits.cpu(), params, temperatures, generators, active, tokens, logprobs)
            for row in range(batch):
                if not active[row]:
                    continue
                if next_tokens[row] in self.eos_ids:
                    tokens[row].pop()
                    logprobs[row].pop()
                    active[row], reasons[row] = False, "stop"
                elif len(tokens[row]) >= limits[row]:
                    active[row] = False
            if not any(active):
                break
            attention = torch.cat([attention, attention.new_ones((batch, 1))], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=torch.tensor(next_tokens, device=self.device)[:, None],
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                **{self._cache_arg: past},
            )
            past = _cache_of(out)
            logits = out.logits[:, -1, :].float()
        return [(tokens[r], logprobs[r], reasons[r]) for r in range(batch)]

    @staticmethod
    def _choose(logits, params, temperatures, generators, active, tokens, logprobs) -> list[int]:
        """Pick each active row's next token (greedy or seeded top-p sampling) and record its log-prob."""
        chosen = [0] * logits.shape[0]
        greedy_lp = None
        for row in range(logits.shape[0]):
            if not active[row]:
                continue
            t = temperatures[row]
            if t == 0:
                if greedy_lp is None:
                    greedy_lp = torch.log_softmax(logits, dim=-1)
                tok = int(torch.argmax(logits[row]))
                lp = float(greedy_lp[row, tok])
            else:
                row_lp = torch.log_softmax(logits[row] / t, dim=-1)
                probs = row_lp.exp()
                top_p = params[row].top_p
                if top_p < 1.0:
                    sorted_p, idx = probs.sort(descending=True)
                    drop = (sorted_p.cumsum(0) - sorted_p) >= top_p
                    sorted_p[drop] = 0.0
                    probs = torch.zeros_like(probs).scatter(0, idx, sorted_p)
                tok = int(torch.multinomial(probs, 1, generator=generators[row]))
                lp = float(row_lp[tok])
            chosen[row] = tok
            tokens[row].append(tok)
            logprobs[row].append(lp)
        return chosen

    # ------------------------------------------------------------------ identity
    def _eos_ids(self) -> set[int]:
        ids = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(x) for x in source)
        return ids

    @property
    def fingerprint(self) -> str:
        """Changes when the weights change (a checksum over a slice of every tensor)."""
        h = hashlib.blake2b(digest_size=12)
        h.update(self.name.encode())
        h.update(str(self.render([{"role": "user", "content": "x"}])).encode())
        with torch.no_grad():
            for p in self.model.parameters():
                h.update(p.detach().reshape(-1)[:256].float().cpu().numpy().tobytes())
        return f"hf:{self.name}:{h.hexdigest()}"
