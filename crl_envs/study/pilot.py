"""``[training.pilot]``: the steps, learning rate and adapter every trainer of a setting gets, fixed before the
comparison by a pilot on its own seeds and on train-split validation questions (never the eval split).

- :class:`PilotConfig` — the table: checkpoints ``steps``, ``rates``, ``adapters``, ``seeds``, the validation
  questions and the ``select`` rule with its ``tolerance`` and ``margin``;
- :func:`pilot_curve` — the pilot cells' results of one setting as its curve: one row per (rate, adapter,
  checkpoint), means over the pilot's seeds;
- :func:`choose_pilot` — the rule, stated before any data.

One fit per (rate, adapter, seed) runs to the largest checkpoint and is evaluated at each one on the way
(:mod:`crl_envs.study.cells.pilot`): a dose-response over four checkpoints costs one fit, not four.

Example:
    >>> rows = [{"learning_rate": lr, "adapter": "full", "steps": k, "before": 0.30, "after": after, "system": system}
    ...         for lr, k, after, system in [(1e-4, 20, 0.31, 0.60), (1e-4, 50, 0.25, 0.70),
    ...                                      (3e-5, 20, 0.30, 0.58), (3e-5, 50, 0.30, 0.61)]]
    >>> choice = choose_pilot(rows, margin=0.02)
    >>> choice["steps"], choice["learning_rate"], choice["adapter"]   # 1e-4 at 50 lowered the learner: not kept
    (20, 0.0001, 'full')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crl_envs.study.gates import learner_kept
from crl_kit.errors import ConfigError

#: The adapters a pilot compares: ``"full"`` fine-tuning, or ``"lora"`` (``[training] lora``'s settings, else
#: :class:`trainers.LoraSettings`' defaults). A tie between them goes to the one listed first here.
ADAPTERS = ("full", "lora")
#: The select rules (:func:`choose_pilot`), named so a config states one. ``fewest_steps_near_best``: the cheapest
#: dose whose validation system score is near the best (a flat curve gives the fewest steps).
#: ``most_steps_kept``: the most training the learner is seen to keep its own accuracy through (a comparison
#: needs a dose at which a trainer can move the system, and the controls need the learner kept).
SELECTIONS = ("fewest_steps_near_best", "most_steps_kept")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class PilotConfig:
    """``[training.pilot]``: the pilot that fixes every training cell's steps, learning rate and adapter (it
    supersedes ``[training.lr_rule]``; a config gives one or the other)."""

    steps: tuple[int, ...] = field(default=(20, 50, 100, 200), metadata=_help(
        "the checkpoints (steps) evaluated: one fit per (rate, adapter, seed) to the largest, evaluated at each"))
    rates: tuple[float, ...] = field(default=(3e-4, 1e-4, 5e-5, 3e-5, 1e-5), metadata=_help(
        "the learning rates fitted (a finer grid than the lr rule's, between and below 1e-3 / 1e-4 / 3e-5)"))
    adapters: tuple[str, ...] = field(default=ADAPTERS, metadata=_help(
        f"what trains: of {list(ADAPTERS)} (lora: [training] lora's settings, else trainers.LoraSettings' defaults)"))
    trainer: str = field(default="grpo", metadata=_help(
        "the trainer the pilot fits (a trainers.ROSTER name; GRPO: the learner-kept rule is about its fit)"))
    seeds: tuple[int, ...] = field(default=(1000,), metadata=_help(
        "the pilot's training seeds (none of the comparison's seeds)"))
    split: str = field(default="train", metadata=_help(
        "the split of the validation questions (never the eval split)"))
    task_seed: int = field(default=2, metadata=_help("the seed drawing the validation questions"))
    n: int = field(default=100, metadata=_help("validation questions"))
    select: str = field(default="fewest_steps_near_best", metadata=_help(
        "the rule, fixed before any data (one of " + ", ".join(SELECTIONS) + "): among the (rate, adapter, steps) "
        "whose fit kept the learner's own accuracy (crl_envs.study.gates.learner_kept, within tolerance), the fewest "
        "steps whose validation system score is within margin of the best kept score; then the higher score, the "
        "smaller rate, the adapter listed first in ADAPTERS. Fewest steps because a score within margin of the best "
        "is as good as n validation questions can tell, and fewer steps cost every comparison cell less and move the "
        "learner less. most_steps_kept: among the kept, the most steps, then the adapter listed first, then the "
        "largest rate (the most training the learner keeps through; margin unused). Nothing kept: the smallest rate "
        "at the fewest steps, the first adapter, said so"))
    tolerance: float = field(default=0.0, metadata=_help(
        "the fall in the learner's own validation accuracy that still counts as kept"))
    margin: float = field(default=0.02, metadata=_help(
        "how far below the best kept validation system score a choice may be (0.02: the +2-point difference the "
        "comparison is powered for; on n = 100 validation questions a score's SE is about 0.05, so a smaller "
        "difference is not one the pilot can see)"))

    def __post_init__(self) -> None:
        key = "study config: training.pilot"
        object.__setattr__(self, "steps", _distinct(f"{key}.steps", self.steps, "integers >= 1, e.g. [20, 50, 100, 200]",
                                                    lambda x: _is_int(x) and x >= 1, reverse=False))
        object.__setattr__(self, "rates", _distinct(f"{key}.rates", self.rates, "learning rates in (0, 1], e.g. "
                                                    "[1e-4, 3e-5]", lambda x: _is_number(x) and 0 < x <= 1,
                                                    reverse=True, cast=float))
        object.__setattr__(self, "seeds", _distinct(f"{key}.seeds", self.seeds, "integers >= 0, e.g. [1000]",
                                                    lambda x: _is_int(x) and x >= 0, reverse=False))
        adapters = self.adapters
        if isinstance(adapters, str) or not isinstance(adapters, (list, tuple)) or not adapters \
                or any(a not in ADAPTERS for a in adapters) or len(set(adapters)) != len(adapters):
            raise ConfigError(f"{key}.adapters must be a non-empty list of {list(ADAPTERS)}, none twice, got {adapters!r}")
        object.__setattr__(self, "adapters", tuple(a for a in ADAPTERS if a in adapters))
        if self.select not in SELECTIONS:
            raise ConfigError(f"{key}.select must be one of {list(SELECTIONS)}, got {self.select!r}")
        for name in ("tolerance", "margin"):
            v = getattr(self, name)
            if not _is_number(v) or not 0 <= v < 1:
                raise ConfigError(f"{key}.{name} must be a number in [0, 1) (e.g. 0.02), got {v!r}")
        for name, low in (("n", 1), ("task_seed", 0)):
            v = getattr(self, name)
            if not _is_int(v) or v < low:
                raise ConfigError(f"{key}.{name} must be an integer >= {low}, got {v!r}")
        if not isinstance(self.split, str) or not isinstance(self.trainer, str):
            raise ConfigError(f"{key}.split and .trainer must be strings, got {self.split!r} and {self.trainer!r}")

    @property
    def fits(self) -> int:
        """Fits per fit group (a setting, or the settings sharing a learner alone): rates x adapters x seeds."""
        return len(self.rates) * len(self.adapters) * len(self.seeds)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _distinct(key: str, values: Any, what: str, ok: Any, *, reverse: bool, cast: Any = int) -> tuple[Any, ...]:
    """``values`` as a sorted tuple, or one line: a non-empty list of ``what``, none twice."""
    if isinstance(values, str) or not isinstance(values, (list, tuple)) or not values or not all(ok(x) for x in values):
        raise ConfigError(f"{key} must be a non-empty list of {what}, got {values!r}")
    if len(set(values)) != len(values):
        raise ConfigError(f"{key} lists a value twice: {list(values)}")
    return tuple(sorted((cast(x) for x in values), reverse=reverse))


def pilot_curve(results: Iterable[Mapping[str, Any]], setup_label: str) -> list[dict[str, Any]]:
    """The curve of one setting from its pilot cells' results (each: ``learning_rate``, ``adapter``, ``seed``,
    ``before`` ``{"alone", "systems": {setup: score}}`` and ``curve``, one ``{"steps", "alone", "systems"}`` per
    checkpoint): one row per (rate, adapter, checkpoint), ``before``/``after`` the learner's own validation
    accuracy before the fit and at the checkpoint and ``system`` the setting's validation system score there,
    each the mean over the pilot's seeds (``seeds``: how many), rates falling, then adapters, then steps."""
    groups: dict[tuple[float, str, int], list[tuple[float, float, float, float, int]]] = {}
    for r in results:
        for point in r["curve"]:
            groups.setdefault((float(r["learning_rate"]), r["adapter"], int(point["steps"])), []).append(
                (r["before"]["alone"], point["alone"], r["before"]["systems"][setup_label], point["systems"][setup_label],
                 r["seed"]))
    rows = []
    for (lr, adapter, steps), values in sorted(groups.items(), key=lambda kv: (-kv[0][0], ADAPTERS.index(kv[0][1]),
                                                                                 kv[0][2])):
        n = len(values)
        before, after, system_before, system = (sum(v[i] for v in values) / n for i in range(4))
        row = {"learning_rate": lr, "adapter": adapter, "steps": steps, "seeds": n, "before": before,
               "after": after, "system_before": system_before, "system": system}
        if n > 1:  # the spread between fits, which one seed cannot show (paper-cpu-pilot: +0.7 on the pilot's seed)
            row["alone_deltas"] = [v[1] - v[0] for v in sorted(values, key=lambda v: v[4])]
        rows.append(row)
    return rows


def choose_pilot(rows: Sequence[Mapping[str, Any]], *, tolerance: float = 0.0, margin: float = 0.02,
                 select: str = "fewest_steps_near_best") -> dict[str, Any]:
    """The (steps, learning rate, adapter) the rule picks from a curve (:func:`pilot_curve`'s rows: each
    ``learning_rate``, ``adapter``, ``steps``, ``before``, ``after``, ``system``): among the rows whose fit kept
    the learner's own accuracy (:func:`crl_envs.study.gates.learner_kept` of ``before``, ``after``, ``tolerance``),
    those whose ``system`` is within ``margin`` of the best kept row's; of them the fewest steps, then the higher
    ``system``, the smaller rate, the adapter first in :data:`ADAPTERS` (``select="fewest_steps_near_best"``); or
    of the kept rows the most steps, then the adapter first in :data:`ADAPTERS`, then the largest rate
    (``select="most_steps_kept"``). No row kept: the smallest rate at the fewest steps, the first adapter. Returns ``{"steps", "learning_rate", "adapter", "kept", "reason"}``.

    Raises:
        ValueError: no rows, or an unknown ``select``."""
    if select not in SELECTIONS:
        raise ValueError(f"choose_pilot: select must be one of {list(SELECTIONS)}, got {select!r}")
    if not rows:
        raise ValueError("choose_pilot needs at least one row of the pilot's curve; run the pilot cells first")

    def adapter_rank(row: Mapping[str, Any]) -> int:
        return ADAPTERS.index(row["adapter"])

    kept = [r for r in rows if learner_kept(r["before"], r["after"], tolerance)]
    if not kept:
        r = min(rows, key=lambda r: (r["steps"], r["learning_rate"], adapter_rank(r)))
        return {"steps": r["steps"], "learning_rate": r["learning_rate"], "adapter": r["adapter"], "kept": 0,
                "reason": "no (rate, adapter, steps) kept the learner's own accuracy: the smallest rate at the fewest "
                          "steps"}
    if select == "most_steps_kept":
        r = min(kept, key=lambda r: (-r["steps"], adapter_rank(r), -r["learning_rate"]))
        return {"steps": r["steps"], "learning_rate": r["learning_rate"], "adapter": r["adapter"], "kept": len(kept),
                "reason": f"the most steps whose fit kept the learner's own accuracy ({r['before']:.3f} -> "
                          f"{r['after']:.3f}), then the first adapter, the largest rate; {len(kept)} of {len(rows)} kept"}
    best = max(r["system"] for r in kept)
    near = [r for r in kept if r["system"] >= best - margin - 1e-12]
    r = min(near, key=lambda r: (r["steps"], -r["system"], r["learning_rate"], adapter_rank(r)))
    return {"steps": r["steps"], "learning_rate": r["learning_rate"], "adapter": r["adapter"], "kept": len(kept),
            "reason": f"the fewest steps whose validation system score ({r['system']:.3f}) is within {margin:g} of the "
                      f"best kept ({best:.3f}), {len(kept)} of {len(rows)} kept the learner's own accuracy"}
