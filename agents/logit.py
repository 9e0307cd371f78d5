"""Logit-level ensembles: models of one vocabulary decode one answer together, token by token.

At every decoding step each member computes its next-token logits for the same prefix; a
:class:`Fusion` rule combines them into one vector, and one token is drawn from it (temperature and
top-p as for a single model, :func:`agents.sampling.sample_next`) and fed back to every member.
:class:`LogitEnsemble` is such an ensemble as an ordinary :class:`~agents.Agent`: its ``generate`` runs
the members' forwards in lockstep over a batch of requests, each member with its own KV cache, so a
protocol plays it like any model (``crl_envs.logit_fusion_v0`` puts it in the ``ensemble`` seat).

The two rules (MoCo's logit level, arXiv 2601.21257):

- ``Fusion("mean")``: the weighted arithmetic mean of the members' raw logits (uniform by default): a
  renormalised product of experts.
- ``Fusion("contrast", strength=λ)``: with the members in their declared order (best first, e.g. by a
  dev ranking) ``z_0 .. z_{k-1}``: ``z_0 + λ Σ_{i < k // 2} (z_i − z_{k-1-i})``: the top model steered
  by the difference between the better and the worse half (DExperts / proxy-tuning style). One member:
  its own logits; an odd member in the middle is unpaired.

Cost as deployed (``Generation.prompt_tokens`` / ``completion_tokens``): every member reads the prompt and
every generated token, so both count **token forwards summed over the members** (``k`` members, ``t``
answer tokens: ``k * t`` completion tokens). For members of one size that is proportional to FLOPs.

Example:
    >>> import agents
    >>> zoo = agents.pool("zoo")
    >>> pair = LogitEnsemble([zoo["model_0"], zoo["model_1"]])
    >>> gen = pair.generate([agents.Request([{"role": "user", "content": "What is 23 + 45?"}])])[0]
    >>> gen.text, gen.completion_tokens == 2 * len(gen.token_ids)
    ('The answer is 68.', True)
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agents.base import Agent, Generation, Request, SamplingParams
from agents.hf import CachedRows, HFAgent, answer_limits, decode_batch
from agents.sampling import cpu_threads
from crl_kit.errors import ConfigError

RULES = ("mean", "contrast")


@dataclass(frozen=True)
class Fusion:
    """How members' next-token logits combine (see the module docstring).

    Args:
        rule: ``"mean"`` or ``"contrast"``.
        weights: for ``"mean"``, one positive weight per member (normalised; ``None``: uniform).
        strength: for ``"contrast"``, λ >= 0.
    """

    rule: str = "mean"
    weights: tuple[float, ...] | None = None
    strength: float = 0.5

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ConfigError(f"unknown fusion rule {self.rule!r}; choose one of {', '.join(RULES)}")
        if self.weights is not None:
            w = tuple(float(x) for x in self.weights)
            if not w or any(not x > 0 or x != x or x == float("inf") for x in w):
                raise ConfigError(f"fusion weights must be finite numbers > 0, got {self.weights!r}")
            object.__setattr__(self, "weights", w)
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float)) or not 0 <= self.strength < float("inf"):
            raise ConfigError(f"contrast strength must be a finite number >= 0 (e.g. 0.5), got {self.strength!r}")
        object.__setattr__(self, "strength", float(self.strength))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Fuse ``(members, ..., vocab)`` logits into ``(..., vocab)``."""
        k = logits.shape[0]
        if self.rule == "mean":
            if self.weights is None:
                return logits.mean(dim=0)
            if len(self.weights) != k:
                raise ConfigError(f"{len(self.weights)} fusion weights for {k} members")
            w = torch.tensor(self.weights, dtype=logits.dtype, device=logits.device)
            return torch.tensordot(w / w.sum(), logits, dims=1)
        fused = logits[0]
        for i in range(k // 2):
            fused = fused + self.strength * (logits[i] - logits[k - 1 - i])
        return fused

    def describe(self) -> str:
        if self.rule == "mean":
            return "mean" if self.weights is None else f"mean{list(self.weights)}"
        return f"contrast(strength={self.strength})"


def check_shared_vocabulary(members: Sequence[Agent], what: str = "logit-level collaboration") -> None:
    """Raise one ``ValueError`` line unless every member is a transformers model (:class:`~agents.HFAgent`)
    and all share one vocabulary (the same token -> id map and output size).

    Raises:
        ValueError: a member that exposes no logits, or two members with different vocabularies.
    """
    if not members:
        raise ConfigError(f"{what} needs at least one member")
    for m in members:
        if not isinstance(m, HFAgent):
            raise ConfigError(f"{what} needs members whose next-token logits are readable (HFAgent); {m.name!r} is a "
                              f"{type(m).__name__}")
    first = members[0]
    vocab, size = first.tokenizer.get_vocab(), first.model.get_output_embeddings().weight.shape[0]
    for m in members[1:]:
        other, other_size = m.tokenizer.get_vocab(), m.model.get_output_embeddings().weight.shape[0]
        if other != vocab or other_size != size:
            raise ConfigError(f"{what} needs one vocabulary: {first.name!r} has {len(vocab)} tokens ({size} logits), "
                              f"{m.name!r} has {len(other)} ({other_size} logits) or maps them to other ids; pool "
                              "models of one tokenizer")


class LogitEnsemble(Agent):
    """Members that share a vocabulary, decoding as one model through a :class:`Fusion` of their logits.

    Args:
        members: :class:`~agents.HFAgent` s of one vocabulary, in the fusion's order.
        fusion: the rule (default: the uniform mean).
        name: display name (default ``mean(a+b+...)``).

    Raises:
        ValueError: members that do not share a vocabulary (:func:`check_shared_vocabulary`), or
            fusion weights whose number is not the members'.
    """

    #: as HFAgent: per-request generators, each row's token a function of its own logits alone
    deterministic = True

    def __init__(self, members: Sequence[HFAgent], fusion: Fusion | None = None, *, name: str | None = None):
        self.members = list(members)
        check_shared_vocabulary(self.members)
        self.fusion = fusion or Fusion()
        if self.fusion.weights is not None and len(self.fusion.weights) != len(self.members):
            raise ConfigError(f"{len(self.fusion.weights)} fusion weights for {len(self.members)} members")
        self.name = name or f"{self.fusion.rule}({'+'.join(m.name for m in self.members)})"
        lead = self.members[0]
        self.tokenizer = lead.tokenizer
        self.eos_ids = set().union(*(m.eos_ids for m in self.members))
        self.batch_size = min(m.batch_size for m in self.members)
        limits = [m.context_length for m in self.members if m.context_length]
        self.context_length: int | None = min(limits) if limits else None
        self.num_threads = lead.num_threads

    @property
    def fingerprint(self) -> str:
        """The rule and every member's fingerprint, in order."""
        h = hashlib.blake2b(digest_size=12)
        h.update(self.fusion.describe().encode())
        for m in self.members:
            h.update(m.fingerprint.encode())
        return f"logit:{self.name}:{h.hexdigest()}"

    def encode(self, messages: list[dict[str, str]]) -> list[list[int]]:
        """Each member's prompt ids for a chat (members may render it with their own templates)."""
        return [m.encode_prompt(messages) for m in self.members]

    def decode_text(self, token_ids: Sequence[int]) -> str:
        return self.members[0].decode_text(token_ids)

    # ------------------------------------------------------------------ generation
    def _generate(self, requests: list[Request]) -> list[Generation]:
        prompts = [self.encode(r.messages) for r in requests]
        for m_index, m in enumerate(self.members):
            m.check_prompts_fit(requests, [p[m_index] for p in prompts], context="the model's context",
                                fix="shorten the prompt")
        order = sorted(range(len(requests)), key=lambda i: max(len(p) for p in prompts[i]))
        results: list[Generation | None] = [None] * len(requests)
        with cpu_threads(self.num_threads):
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                t0 = time.perf_counter()
                outs = self.decode([prompts[i] for i in chunk], [requests[i].sampling for i in chunk])
                share = (time.perf_counter() - t0) / len(chunk)
                for i, (tokens, logprobs, reason) in zip(chunk, outs):
                    k = len(self.members)
                    results[i] = Generation(text=self.decode_text(tokens), token_ids=tokens, logprobs=logprobs,
                                            finish_reason=reason, prompt_tokens=sum(len(p) for p in prompts[i]),
                                            completion_tokens=k * len(tokens), prompt_token_ids=prompts[i][0],
                                            seconds=share)
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def decode(self, prompts: list[list[list[int]]], params: list[SamplingParams]
               ) -> list[tuple[list[int], list[float], str]]:
        """Decode one batch: ``prompts[row][member]`` are the prompt ids. Every member prefills its own
        left-padded prompts (:class:`~agents.hf.CachedRows`), then :func:`~agents.hf.decode_batch`, HFAgent's
        token loop, draws each row's token from the fused logits and feeds it to every member through its KV
        cache. Returns ``(tokens, log-probs under the fused distribution, finish reason)``."""
        rows = _FusedRows([CachedRows(m, [row[j] for row in prompts]) for j, m in enumerate(self.members)], self.fusion)
        limits = answer_limits(params, [max(len(x) for x in prompt) for prompt in prompts], self.context_length)
        return decode_batch(self, rows, rows.prefill(), params, limits)

    # ------------------------------------------------------------------ scoring (C-RL)
    def fused_logits(self, prompt_ids: Sequence[Sequence[int]], answer_ids: Sequence[int], *,
                     grad_members: Sequence[int] = ()) -> torch.Tensor:
        """The fused logits ``(len(answer_ids), vocab)`` that predicted each answer token, by one forward of
        every member over its prompt plus the answer (teacher forcing). Members listed in ``grad_members``
        keep their autograd graph (a learner's share of the fused distribution); the others do not."""
        rows = []
        for j, m in enumerate(self.members):
            ids = torch.tensor([list(prompt_ids[j]) + list(answer_ids)], device=m.device)
            with torch.set_grad_enabled(j in grad_members):
                out = m.model(input_ids=ids).logits[0].float()
            start = len(prompt_ids[j]) - 1
            rows.append(out[start : start + len(answer_ids)])
        return self.fusion(torch.stack(rows))


@torch.no_grad()
def next_token_logits(agent: HFAgent, token_ids: Sequence[int]) -> torch.Tensor:
    """``agent``'s next-token logits ``(vocab,)`` after ``token_ids`` (one forward, no cache): the action of
    a member in the step-level logit env (:class:`crl_envs.protocols.logit_fusion.LogitStepEnv`)."""
    ids = torch.tensor([list(token_ids)], device=agent.device)
    return agent.model(input_ids=ids).logits[0, -1].float()


class _FusedRows:
    """The members' :class:`~agents.hf.CachedRows` in lockstep, seen by :func:`~agents.hf.decode_batch` as one
    model whose next-token logits are the fusion of theirs. Finished rows stay in the members' caches (as
    before the loop was shared): dropping them would change the batch a step's forward sees, which may move
    the log-probs' last bits."""

    def __init__(self, members: list[CachedRows], fusion: Fusion):
        self.members, self.fusion, self.device = members, fusion, members[0].device

    @property
    def positions(self) -> torch.Tensor:
        """Each row's furthest last position over the members (whose prompts may differ in length)."""
        return torch.stack([m.positions[:, -1:] for m in self.members]).amax(dim=0)

    def prefill(self) -> torch.Tensor:
        return self.fusion(torch.stack([m.prefill() for m in self.members]))

    def step(self, chosen: torch.Tensor, room: int) -> torch.Tensor:
        return self.fusion(torch.stack([m.step(chosen, room) for m in self.members]))

    def select_rows(self, index: torch.Tensor) -> bool:
        return False


__all__ = ["Fusion", "LogitEnsemble", "check_shared_vocabulary", "next_token_logits", "RULES"]
