"""The token sampler every local backend decodes with (HFAgent, LlamaCppAgent), and torch's thread count.

:func:`sample_next` draws each row of a batch from its own ``torch.Generator``: a row's token depends
only on its logits and seed, never on the other rows, so the same request gives the same text whatever
it is batched with and whichever backend computed the logits. The top-p draw is :func:`nucleus_draw`,
which gives :func:`sorted_nucleus_draw`'s tokens exactly, mostly without sorting the vocabulary
(``tests/test_fast_decoding.py`` proves it; ``benchmarks/nucleus_draw.py`` times it).

Example:
    >>> import torch
    >>> from agents.sampling import sample_next
    >>> logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    >>> tokens, _ = sample_next(logits, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), [None, None])
    >>> tokens.tolist()  # temperature 0: the argmax of each row
    [1, 0]
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run the block with ``torch.set_num_threads(n)``, restoring the previous setting after."""
    if n is None or n == torch.get_num_threads():
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def sample_next(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, generators: Sequence[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token and its log-probability, for a whole batch at once.

    Rows with temperature 0 take the argmax (log-prob under the raw logits). Other rows sample from
    ``softmax(logits / temperature)`` restricted to the top-p nucleus, by inverse CDF with one
    uniform draw from the row's own generator: a row's token depends only on its logits and seed,
    never on the other rows of the batch. Log-probs are under the temperature-scaled distribution.
    The draw is :func:`nucleus_draw`, which gives the tokens of a full sort without doing one.
    """
    greedy = temperature == 0
    if bool(greedy.all()):  # x / 1 is x: skip a pass over the whole vocabulary
        scaled = logits
    else:
        scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    chosen = logits.argmax(dim=-1)
    sampled = [j for j, g in enumerate(generators) if g is not None]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        uniform = torch.cat([torch.rand(1, generator=generators[j]) for j in sampled]).to(logits.device)
        rows = logp if len(sampled) == len(generators) else logp[index]  # no copy when every row samples
        chosen[index] = nucleus_draw(rows.exp(), top_p[index], uniform)
    return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)


#: candidates :func:`nucleus_draw` ranks (the few rows a window cannot decide try the next one,
#: then the whole vocabulary is sorted)
DRAW_WINDOWS = (256, 4096)
#: a generous bound on float32 rounding in the nucleus' cumulative sums (16 ulps of 1.0)
_ROUNDING = 1e-6


def sorted_nucleus_draw(probs: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The reference draw: sort each row's probabilities (descending, ties by token id), keep the
    top-p nucleus, and take the token where ``uniform`` times the nucleus' mass falls on its CDF."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    outside = (sorted_p.cumsum(-1) - sorted_p) >= top_p[:, None]
    cdf = sorted_p.masked_fill(outside, 0.0).cumsum(-1)
    rank = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None]).clamp(max=probs.shape[-1] - 1)
    return order.gather(-1, rank).squeeze(-1)


def nucleus_draw(probs: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """:func:`sorted_nucleus_draw`'s tokens, exactly, mostly without sorting the whole vocabulary.

    A full sort per row per step cost 0.31 s per step at batch 64 over a 49k vocabulary (2.0 s over
    262k; ``benchmarks/nucleus_draw.py``), about as much as the model's forward. Instead each row first ranks only its most
    likely tokens (:data:`DRAW_WINDOWS`); see :func:`_window_draw` for why that gives the same
    token whenever it decides. Rows no window decides are sorted in full.
    """
    chosen = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    pending = torch.arange(probs.shape[0], device=probs.device)
    for window in DRAW_WINDOWS:
        if probs.shape[-1] <= 4 * window or not pending.numel():
            break
        everyone = len(pending) == probs.shape[0]  # the first window: no copy of every row
        rows = (probs, top_p, uniform) if everyone else (probs[pending], top_p[pending], uniform[pending])
        tokens, decided = _window_draw(*rows, window)
        chosen[pending[decided]] = tokens[decided]
        pending = pending[~decided]
    if pending.numel():
        chosen[pending] = sorted_nucleus_draw(probs[pending], top_p[pending], uniform[pending])
    return chosen


def _window_draw(
    probs: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference draw from each row's ``window`` most likely tokens, and whether it is decided.

    The window's cumulative sums are the full sort's first ``window`` sums (the same values added
    in the same order). When the nucleus ends inside the window, the draw is the reference's.
    When it ends beyond, its mass lies in an interval known without the tail's order (at least
    ``min(total, top_p)``, at most ``min(total, top_p + the window's smallest probability)``, give
    or take rounding): the draw is decided when that whole interval lands on one token of the
    window, and when no tie straddles the window's edge.
    """
    top_values, top_ids = probs.topk(window + 1, dim=-1)
    ids, _ = top_ids[:, :window].sort(dim=-1)  # the reference orders ties by token id
    window_p, order = probs.gather(-1, ids).sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(-1, order)
    outside = (window_p.cumsum(-1) - window_p) >= top_p[:, None]
    cdf = window_p.masked_fill(outside, 0.0).cumsum(-1)
    ends_inside = outside[:, -1]
    total = probs.sum(-1, dtype=torch.float64).to(probs.dtype)
    low = torch.where(ends_inside, cdf[:, -1], torch.minimum(total, top_p) - _ROUNDING)
    high = torch.where(ends_inside, cdf[:, -1], torch.minimum(total, top_p + window_p[:, -1]) + _ROUNDING)
    rank_low = torch.searchsorted(cdf, (uniform * low)[:, None]).squeeze(-1)
    rank_high = torch.searchsorted(cdf, (uniform * high)[:, None]).squeeze(-1)
    decided = (rank_low == rank_high) & (rank_high < window) & (top_values[:, window - 1] > top_values[:, window])
    return ids.gather(-1, rank_high.clamp(max=window - 1)[:, None]).squeeze(-1), decided


__all__ = ["cpu_threads", "sample_next", "nucleus_draw", "sorted_nucleus_draw", "DRAW_WINDOWS"]
