"""What a coalition's run costs, per question, as deployed: model calls, prompt tokens, generated
tokens and seconds (not to be confused with :mod:`crl_envs.valuation.cost`, which *estimates*
generation counts for dry runs without running a model).

Counts are "as deployed": every answer a coalition's system gives is counted, whether this process
generated it or reused it from the request memo (:class:`crl_envs.runner.RequestMemo` dedups identical
requests across coalitions; a deployment of one coalition would pay for each of them). They come from
the :class:`crl_envs.runner.Usage` each episode records per agent (role agents such as a judge
included), summed over agents and averaged over samples, like the scores.

Calls and tokens are deterministic for deterministic agents, so they sit beside the scores in the
coalition cache and in reports compared bit for bit. ``seconds`` (each request's share of its batch's
wall time; a memo-reused answer carries the seconds of the run that generated it) is not: it is
kept and shown, never compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from crl_kit.errors import ConfigError
from crl_kit.validation import is_int, numbers_problem

#: The fields of a :class:`Spend`, in order; all but ``seconds`` are deterministic.
FIELDS = ("calls", "prompt_tokens", "generated_tokens", "seconds")
DETERMINISTIC = FIELDS[:3]


@dataclass(eq=False)
class Spend:
    """One coalition's cost per question (each a ``(questions,)`` array, averaged over samples)."""

    calls: np.ndarray
    prompt_tokens: np.ndarray
    generated_tokens: np.ndarray
    seconds: np.ndarray

    def __post_init__(self) -> None:
        for name in FIELDS:
            setattr(self, name, np.asarray(getattr(self, name), dtype=float))

    @property
    def tokens(self) -> np.ndarray:
        """Prompt plus generated tokens per question."""
        return self.prompt_tokens + self.generated_tokens

    def field(self, name: str) -> np.ndarray:
        """``calls``, ``prompt_tokens``, ``generated_tokens``, ``tokens`` or ``seconds`` per question."""
        if name == "tokens":
            return self.tokens
        if name not in FIELDS:
            raise KeyError(f"no cost {name!r}; costs are tokens, {', '.join(FIELDS)}")
        return getattr(self, name)

    @classmethod
    def zero(cls, questions: int) -> Spend:
        """The empty coalition's cost: nothing runs."""
        return cls(*(np.zeros(questions) for _ in FIELDS))

    def to_dict(self) -> dict[str, list[float]]:
        return {name: getattr(self, name).tolist() for name in FIELDS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], questions: int) -> tuple[Spend | None, str]:
        """The spend :meth:`to_dict` wrote, validated (one finite, non-negative number per question per
        field), or ``(None, what is wrong)``."""
        if not isinstance(d, Mapping):
            return None, "no cost record (written before costs were kept)"
        values = {}
        for name in FIELDS:
            raw = d.get(name)
            if not isinstance(raw, list) or len(raw) != questions:
                return None, f"its cost {name!r} is not {questions} numbers"
            if numbers_problem(name, raw, (questions,), low=0):  # a string, NaN, -1 or 10**400: refused
                return None, f"its cost {name!r} has a negative or non-finite entry"
            values[name] = np.asarray(raw, dtype=float)
        return cls(**values), ""


def spend_of(episodes: Sequence[Any], example_ids: Sequence[str], samples: int) -> Spend:
    """The per-question :class:`Spend` of a coalition's episodes (their ``usage`` summed over agents,
    averaged over ``samples``), in ``example_ids`` order."""
    index = {eid: k for k, eid in enumerate(example_ids)}
    totals = np.zeros((len(FIELDS), len(example_ids)))
    for ep in episodes:
        k = index[ep.example_id]
        for u in ep.usage.values():
            totals[:, k] += (u.calls, u.prompt_tokens, u.completion_tokens, u.seconds)
    return Spend(*(totals / samples))


def stack(spends: Sequence[Spend], name: str) -> np.ndarray:
    """The ``(len(spends), questions)`` table of cost ``name`` (as :meth:`Spend.field` names it)."""
    return np.stack([s.field(name) for s in spends])


@dataclass(eq=False)
class CoalitionCosts:
    """Every coalition a valuation played, its per-question value beside its per-question cost: what
    :mod:`crl_envs.valuation.fronts` draws cost-quality fronts from."""

    protocol: str
    ids: list[str]
    masks: list[int]
    values: np.ndarray  # (coalitions, questions)
    spends: list[Spend]

    def __post_init__(self) -> None:
        self.values = np.asarray(self.values, dtype=float)
        if self.values.shape[0] != len(self.masks) or len(self.spends) != len(self.masks):
            raise ConfigError(f"{len(self.masks)} coalitions, {self.values.shape[0]} value rows and "
                              f"{len(self.spends)} costs: one of each per coalition")

    def members(self, mask: int) -> list[str]:
        return [a for i, a in enumerate(self.ids) if mask >> i & 1]

    def table(self, name: str) -> np.ndarray:
        """``(coalitions, questions)`` of cost ``name`` (``tokens``, ``calls``, ``seconds``, ...)."""
        return stack(self.spends, name)

    def to_dict(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "ids": self.ids, "masks": self.masks,
                "members": [self.members(m) for m in self.masks], "values": self.values.tolist(),
                "spends": [s.to_dict() for s in self.spends]}

    @classmethod
    def problem(cls, d: Any, questions: int | None = None) -> str | None:
        """What is wrong with ``d`` as a :meth:`to_dict` record (``None``: nothing), read back from a file: each
        mask a distinct non-empty coalition of its ``ids``, one row of ``questions`` values in [0, 1] per mask
        (a coalition's accuracy edited to 7.0 is refused, never put on a front) and a valid :class:`Spend` per
        mask (no negative, non-finite or non-numeric cost)."""
        if not isinstance(d, Mapping) or not isinstance(d.get("ids"), list) or not isinstance(d.get("masks"), list) \
                or not isinstance(d.get("values"), list) or not isinstance(d.get("spends"), list):
            return "coalition costs lack ids, masks, values or spends"
        masks, full = d["masks"], (1 << len(d["ids"])) - 1
        bad = next((m for m in masks if not is_int(m) or not 0 < m <= full), None)
        if bad is not None or len(set(masks)) != len(masks):
            return f"coalition costs name a coalition that is not one of {len(d['ids'])} models ({bad!r})" \
                if bad is not None else "coalition costs list a coalition twice"
        if len(d["values"]) != len(masks) or len(d["spends"]) != len(masks):
            return f"coalition costs have {len(d['values'])} value rows and {len(d['spends'])} costs for {len(masks)} coalitions"
        if questions is None:
            questions = len(d["values"][0]) if d["values"] and isinstance(d["values"][0], list) else 0
        problem = numbers_problem("coalition values", d["values"], (len(masks), questions), low=0, high=1)
        if problem:
            return problem
        for m, raw in zip(masks, d["spends"]):
            problem = Spend.from_dict(raw, questions)[1]
            if problem:
                return f"coalition {m}: {problem}"
        return None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CoalitionCosts:
        """The record :meth:`to_dict` wrote, validated (:meth:`problem`).

        Raises:
            ConfigError: the record is not a valid one (one line naming what is wrong)."""
        problem = cls.problem(d)
        if problem:
            raise ConfigError(f"{problem}; the record was edited or damaged: value the models again")
        q = len(d["values"][0]) if d["values"] else 0
        spends = [Spend.from_dict(raw, q)[0] for raw in d["spends"]]
        return cls(d["protocol"], list(d["ids"]), [int(m) for m in d["masks"]], np.asarray(d["values"], dtype=float),
                   spends)

    def summary(self, names: Sequence[str] | None = None, limit: int = 12) -> str:
        """A readable table: each coalition's value and mean cost per question (the ``limit`` largest
        coalitions and the singles when there are many)."""
        names = list(names or self.ids)
        label = {a: nm for a, nm in zip(self.ids, names)}
        order = sorted(range(len(self.masks)), key=lambda k: (-bin(self.masks[k]).count("1"), self.masks[k]))
        if len(order) > limit:
            singles = [k for k in order if bin(self.masks[k]).count("1") == 1]
            order = list(dict.fromkeys(order[: max(1, limit - len(singles))] + singles))
        out = [f"cost per coalition ({self.protocol}; per question, as deployed; {len(self.masks)} coalitions"
               + (f", {len(order)} shown" if len(order) < len(self.masks) else "") + "):",
               f"  {'coalition':44s} {'value':>6s} {'calls':>6s} {'prompt tok':>10s} {'gen tok':>8s} {'seconds':>8s}"]
        for k in order:
            s = self.spends[k]
            who = "+".join(label[a] for a in self.members(self.masks[k]))
            out.append(f"  {who[:44]:44s} {self.values[k].mean():6.3f} {s.calls.mean():6.2f} "
                       f"{s.prompt_tokens.mean():10.1f} {s.generated_tokens.mean():8.1f} {s.seconds.mean():8.4f}")
        return "\n".join(out)


def ratio_cis(numerator: np.ndarray, denominator: np.ndarray, *, resamples: int, level: float,
              seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ratio of means, (rows, 2) percentile CIs)`` of two ``(rows, questions)`` tables, resampling
    questions with the draws :func:`crl_envs.stats.bootstrap_cis` makes for the same ``seed`` (so the
    intervals are paired with the measures'). A zero denominator gives NaN."""
    q = numerator.shape[1]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, q, size=(resamples, q))
    with np.errstate(invalid="ignore", divide="ignore"):
        point = numerator.mean(axis=1) / denominator.mean(axis=1)
        boot = numerator[:, idx].mean(axis=-1) / denominator[:, idx].mean(axis=-1)
    alpha = (1 - level) / 2
    finite = np.isfinite(boot).all(axis=1)
    cis = np.full((numerator.shape[0], 2), np.nan)
    if finite.any():
        cis[finite] = np.quantile(boot[finite], [alpha, 1 - alpha], axis=1).T
    return point, cis
