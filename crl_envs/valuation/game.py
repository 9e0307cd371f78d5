"""The coalition game of a pool under a protocol, with an on-disk cache of every coalition's run.

``v(S)`` is the **per-question score vector** of the system played by coalition ``S`` through
:func:`crl_envs.run_episodes`, averaged over samples. Every coalition plays the same example ids with
the same seeds (the runner derives each request's seed from the run seed, the example, the sample,
the agent and the phase), so coalitions are compared question by question (a paired design).

Coalitions are bitmasks over the pool's order: bit ``i`` set means ``model_i`` takes part.

Cache layout (version 3): ``<cache_dir>/<protocol>/<coalition key>.json`` holds one coalition's
per-question scores and what it cost as deployed (:class:`~crl_envs.valuation.spend.Spend`: calls,
prompt and generated tokens, seconds; version 2 kept no cost, so its files are ignored and the
coalitions played again). A coalition's key hashes what actually plays it: its **members'** ids, names and
fingerprints (an ``HFAgent``'s changes with its weights), the protocol and its options, role agents
(e.g. a judge), whatever the protocol derives from the rest of the pool for these members
(:meth:`crl_envs.protocols.base.ProtocolEnv.coalition_context`, e.g. a ring topology's closing edge),
the task's fingerprint and examples (ids, questions, answers and metadata: a code task's tests and
setup code, so the content of a ``path=`` file, not its name), the members' sampling settings,
samples and seed. A file is validated when read (its key, its questions, one finite score in [0, 1]
per question, and a cost record); one that fails is played again, with a warning naming it. So a coalition
is the same game in every pool that holds it: adding a model to a pool of ``n`` plays only the ``2^n``
coalitions that contain it, and two pools that share members share their common coalitions. (Version 1
keyed every coalition by the whole pool; its files are ignored and may be deleted.) Each file is
written atomically (temp file, fsync, ``os.replace``) by the driver process as soon as its run ends,
so a killed run loses at most the coalitions in flight and a second run recomputes nothing.

Where runs execute is the game's ``executor``: :class:`~crl_envs.valuation.executors.LocalExecutor`
(one after another, in this process; the default) or
:class:`~crl_envs.valuation.executors.RayExecutor` (each coalition a Ray task). Both play a
coalition through the same :func:`~crl_envs.valuation.coalition.coalitions_scores` (several coalitions in lockstep, each distinct
request generated once: :class:`crl_envs.runner.RequestMemo`), so they give the same numbers.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from agents import Agent, Pool, SamplingParams
from agents import pool as make_pool
from crl_envs import protocols
from crl_envs import tasks as task_registry
from crl_envs.protocols.base import answer_codes
from crl_envs.runner import ProtocolFactory
from crl_envs.tasks import Task
from crl_envs.valuation.coalition import (
    CoalitionRun,
    SoloAnswers,
    atomic_write_json,
    canonical,
    canonical_sampling,
    digest,
    members_of,
    read_json,
)
from crl_envs.valuation.cost import calls_per_episode, distinct_calls
from crl_envs.valuation.executors import Executor, resolve_executor
from crl_envs.valuation.spend import DETERMINISTIC, Spend
from crl_kit.errors import ConfigError
from crl_kit.validation import numbers_problem

CACHE_VERSION = 3
#: The protocol whose one-member coalition is "the model alone, answering the task once".
INDIVIDUAL_PROTOCOL = "vote"
INDIVIDUAL_PROTOCOL_NAME = "vote_v0"


def default_cache_dir() -> Path:
    """``$CRL_ENVS_CACHE/valuation`` or ``~/.cache/crl_envs/valuation``."""
    root = os.environ.get("CRL_ENVS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "crl_envs")
    return Path(root) / "valuation"


def mask_of(members: Iterable[int]) -> int:
    """The bitmask of a coalition given by member indices."""
    mask = 0
    for i in members:
        mask |= 1 << int(i)
    return mask


def aggregate_scores(rule: Any, codes: np.ndarray, scores: np.ndarray, masks: Sequence[int] | np.ndarray) -> np.ndarray:
    """Each coalition's score per row when a protocol's aggregation ``rule`` (as
    :func:`crl_envs.protocols.base.plurality_winners`) gives one member's answer: ``(rows, len(masks))``.

    ``codes`` is ``(rows, n)`` answer codes (equal codes for equal answers, ``-1`` no answer), ``scores``
    ``(n, rows)`` each member's score of its own answer. A coalition where nobody answered scores as its
    lowest member's unparseable answer, as a played run does. Used by :class:`CoalitionGame` for a computed
    game and by anything that values such a protocol straight from answers (``benchmarks/pools16.py``).

    Example:
        >>> from crl_envs.protocols.base import plurality_winners
        >>> codes = np.array([[0, 1, 1], [0, -1, -1]])
        >>> right = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
        >>> aggregate_scores(plurality_winners, codes, right, [0b011, 0b110, 0b111]).tolist()
        [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]
    """
    masks = np.asarray(masks, dtype=np.int64)
    winner = rule(codes, masks)  # (rows, coalitions), -1 where nobody in the coalition answered
    lowest = np.array([(m & -m).bit_length() - 1 for m in masks.tolist()], dtype=np.int64)
    winner = np.where(winner < 0, lowest[None, :], winner)
    return scores[winner, np.arange(codes.shape[0])[:, None]]


class CoalitionGame:
    """``v(S)`` per question for every coalition ``S`` of ``pool`` playing ``protocol`` on ``task``.

    Args:
        protocol: a protocol factory (``crl_envs.debate_v0``) or name (``"debate"``).
        pool: the players (a :class:`agents.Pool` or anything :func:`agents.pool` accepts).
        task: a Task or a task name; every example is played.
        samples: episodes per question (scores are averaged over them).
        seed: the run seed passed to :func:`run_episodes`.
        sampling: sampling settings (one for all, or per agent id); default greedy.
        options: keyword arguments of the protocol factory.
        cache_dir: where results live (default :func:`default_cache_dir`); ``False`` disables the disk cache.
        progress: show a progress bar over coalitions.
        executor: where coalition runs execute: ``"local"`` (default), ``"ray"``, or an
            :class:`~crl_envs.valuation.executors.Executor` such as ``RayExecutor("head:6379")``.
        memo: generate each distinct request of a deterministic agent once, across coalitions (and
            games) played in this process (:data:`crl_envs.valuation.coalition.MEMO`). Results are
            identical either way; ``False`` generates every request (for comparisons).

    ``evaluations`` counts the coalition runs this object actually executed (cache hits excluded).
    """

    def __init__(
        self,
        protocol: ProtocolFactory | str,
        pool: Pool | Sequence[Agent | str] | str,
        task: Task | str,
        *,
        samples: int = 1,
        seed: int = 0,
        sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
        options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike | None | bool = None,
        progress: bool = True,
        executor: Executor | str = "local",
        memo: bool = True,
    ):
        if not isinstance(memo, bool):
            raise ConfigError(f"memo must be True or False, got {memo!r}")
        self.memo = memo
        self.executor = resolve_executor(executor)
        self.factory = protocols.get(protocol)
        self.pool = pool if isinstance(pool, Pool) else make_pool(pool)
        self.task = task if isinstance(task, Task) else task_registry.load(task)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ConfigError(f"samples must be an int >= 1 (episodes per question), got {samples!r}; e.g. samples=4")
        self.samples, self.seed = samples, int(seed)
        self.sampling = sampling
        self.options = dict(options or {})
        self.progress = progress
        probe = self.factory(self.pool, self.task, **self.options)
        self.protocol_name: str = probe.metadata["name"]
        self._role_agents: dict[str, Agent] = dict(getattr(probe, "role_agents", {}))
        self.empty_value: float = _empty_value(probe, self.task)
        self.ids: list[str] = list(self.pool.ids)
        self.n = len(self.ids)
        self.example_ids: list[str] = [e.id for e in self.task.examples]
        self.evaluations = 0
        self._memory: dict[int, np.ndarray] = {}
        self._spend: dict[int, Spend] = {}
        self._probe = probe
        #: the protocol's rule picking the system's answer from its members' independent answers
        #: (:attr:`~crl_envs.protocols.base.ProtocolEnv.aggregate`), or ``None``: coalitions are played
        self.aggregate = type(probe).aggregate
        self._solo: dict[int, SoloAnswers] = {}
        self._keys: dict[int, str] = {}
        self._costs: dict[int, float] = {}
        self.key = digest(self.describe())
        if cache_dir is False:
            self.root: Path | None = None
            self.directory: Path | None = None
        else:
            self.root = Path(cache_dir) if cache_dir not in (None, True) else default_cache_dir()
            self.directory = self.root / self.protocol_name
            self.directory.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ identity
    def describe(self) -> dict[str, Any]:
        """Everything that determines the game (hashed into :attr:`key`): the whole pool and the rest."""
        return {**self._common(), "pool": [[i, self.pool[i].name, self.pool[i].fingerprint] for i in self.pool.ids],
                "sampling": canonical_sampling(self.sampling)}

    def _common(self) -> dict[str, Any]:
        return {
            "version": CACHE_VERSION,
            "protocol": self.protocol_name,
            "protocol_factory": f"{getattr(self.factory, '__module__', '')}.{getattr(self.factory, '__qualname__', '')}",
            "options": canonical(self.options),
            "roles": {r: a.fingerprint for r, a in sorted(self._role_agents.items())},
            "task": self.task.fingerprint,
            # by content, not by file name: an example's metadata holds what scores it beyond its answer
            # (a code task's tests, setup code and entry point; the choices of a multiple-choice row)
            "examples": digest([[e.id, e.question, e.answer, canonical(e.metadata)] for e in self.task.examples]),
            "n_examples": len(self.task),
            "samples": self.samples,
            "seed": self.seed,
        }

    def describe_coalition(self, mask: int) -> dict[str, Any]:
        """Everything that determines coalition ``mask``'s result (hashed into :meth:`coalition_key`):
        its members (not the rest of the pool), what the protocol derives from the pool for them, and
        the game's protocol, options, roles, task, examples, members' sampling, samples and seed."""
        members = [self.ids[i] for i in members_of(mask, self.n)]
        return {**self._common(),
                "members": [[a, self.pool[a].name, self.pool[a].fingerprint] for a in members],
                "context": canonical(self._probe.coalition_context(members)),
                "sampling": canonical_sampling(self.sampling, members + sorted(self._role_agents))}

    def coalition_key(self, mask: int) -> str:
        """The cache key of coalition ``mask``: the same in every pool whose coalition plays the same game."""
        if mask not in self._keys:
            self._keys[mask] = digest(self.describe_coalition(mask))
        return self._keys[mask]

    def cost(self, mask: int) -> float:
        """Model calls per question of coalition ``mask`` (measured by scripted stand-ins, no model run)."""
        if mask not in self._costs:
            members = [self.ids[i] for i in members_of(mask, self.n)]
            try:
                self._costs[mask] = calls_per_episode(self.factory, self.pool.names, self.task, members, self.options)
            except Exception:  # a protocol the stand-ins cannot play: count its members
                self._costs[mask] = float(len(members))
        return self._costs[mask]

    # ------------------------------------------------------------------ values
    def value(self, mask: int) -> np.ndarray:
        """``v(S)`` per question (shape ``(questions,)``); the empty coalition is ``empty_value``."""
        return self.values([mask])[mask]

    @property
    def computed(self) -> bool:
        """Whether coalitions of two or more members are computed from the members' one-member runs (the
        protocol has an :attr:`aggregate` rule) instead of played."""
        return self.aggregate is not None

    def values(self, masks: Iterable[int]) -> dict[int, np.ndarray]:
        """``v(S)`` per question for each mask; missing coalitions are played (and cached) by the executor,
        or, for a protocol with an :attr:`aggregate` rule, computed from its members' one-member runs."""
        masks = self._check_masks(masks)
        self._complete(masks)
        return {m: self._lookup(m) if m else np.full(len(self.example_ids), self.empty_value) for m in masks}

    def spends(self, masks: Iterable[int]) -> dict[int, Spend]:
        """What each coalition cost per question as deployed (played and cached like its values; a computed
        coalition costs its members' one-member runs together); the empty coalition costs nothing."""
        masks = self._check_masks(masks)
        self._complete(masks)
        for m in masks:
            self._lookup(m)
        return {m: self._spend[m] if m else Spend.zero(len(self.example_ids)) for m in masks}

    def missing(self, masks: Iterable[int]) -> list[int]:
        """The non-empty coalitions among ``masks`` whose result is not known yet and must be played: for a
        computed game (:attr:`computed`), the one-member coalitions whose member's answers are not known."""
        masks = self._check_masks(masks)
        if self.computed:
            masks = self._singles_of([m for m in masks if m and m not in self._memory])
        return [m for m in masks if m and self._lookup(m) is None]

    def _singles_of(self, masks: list[int]) -> list[int]:
        """The one-member coalitions of every member of ``masks``."""
        union = 0
        for m in masks:
            union |= m
        return [1 << i for i in members_of(union, self.n)]

    def _complete(self, masks: list[int]) -> None:
        """Make every mask's result known: play what is missing, then compute a computed game's coalitions."""
        play_coalitions([(self, masks)])
        if self.computed:
            todo = [m for m in masks if m and m not in self._memory]
            if todo:
                self._compute(todo)

    def _compute(self, masks: list[int]) -> None:
        """Each coalition's scores and spend from its members' one-member runs, all at once: per question and
        sample, the protocol's :attr:`aggregate` rule picks the member whose answer the system gives, and the
        episode scores that member's alone run's score (the task's score of the same answer; no answer at
        all scores as the members' own unparseable answers do). Averaged over samples in sample order and
        spent as the members' runs together, as a played run averages and spends."""
        q, k = len(self.example_ids), self.samples
        nobody = SoloAnswers([[None] * k for _ in range(q)], np.zeros((q, k)))  # a model in none of the masks
        solo = [self._solo.get(1 << i, nobody) for i in range(self.n)]
        codes = np.empty((q * k, self.n), dtype=np.int64)
        for row, (e, s) in enumerate(np.ndindex(q, k)):
            codes[row] = answer_codes([solo[i].answers[e][s] for i in range(self.n)])
        scores = np.stack([x.scores.reshape(-1) for x in solo])  # (n, q * k)
        for start in range(0, len(masks), 4096):  # bounded memory: rows x 4096 coalitions at a time
            chunk = np.asarray(masks[start:start + 4096], dtype=np.int64)
            picked = aggregate_scores(self.aggregate, codes, scores, chunk).reshape(q, k, len(chunk))
            totals = np.zeros((q, len(chunk)))
            for s in range(k):
                totals += picked[:, s]
            for j, m in enumerate(chunk.tolist()):
                self._memory[m], self._spend[m] = totals[:, j] / k, self._members_spend(m)

    def _members_spend(self, mask: int) -> Spend:
        """A computed coalition's spend: its members' one-member runs together. Calls and tokens are whole
        numbers per episode, so each member's mean over samples times ``samples`` is summed before dividing,
        as a played run does."""
        k = self.samples
        spends = [self._spend[1 << i] for i in members_of(mask, self.n)]
        fields = [np.rint(sum(np.rint(sp.field(f) * k) for sp in spends)) / k for f in DETERMINISTIC]
        return Spend(*fields, sum(sp.seconds for sp in spends))

    def table(self, masks: Sequence[int]) -> np.ndarray:
        """The ``(len(masks), questions)`` score table of the given coalitions."""
        vals = self.values(masks)
        return np.stack([vals[int(m)] for m in masks]) if len(masks) else np.zeros((0, len(self.example_ids)))

    def cached(self, mask: int) -> bool:
        """Whether ``mask``'s result is already known (in memory or on disk), or, in a computed game, can be
        computed without playing anything."""
        return mask == 0 or self._lookup(mask) is not None or (self.computed and not self.missing([mask]))

    # ------------------------------------------------------------------ internals
    def _path(self, mask: int) -> Path | None:
        return None if self.directory is None else self.directory / f"{self.coalition_key(mask)}.json"

    def _lookup(self, mask: int) -> np.ndarray | None:
        if mask in self._memory:
            return self._memory[mask]
        path = self._path(mask)
        if path is None or not path.exists():
            return None
        scores, spend, solo, problem = self._read(path, mask)
        if problem:  # tampered with or damaged: never reported, played again (and the file rewritten)
            warnings.warn(f"coalition cache file {path}: {problem}; ignoring it, the coalition is played again",
                          RuntimeWarning, stacklevel=2)
            return None
        if self.computed and solo is None:  # written before answers were kept: played again, for them
            return None
        self._memory[mask], self._spend[mask] = scores, spend
        if solo is not None:
            self._solo[mask] = solo
        return scores

    def _read(self, path: Path, mask: int) -> tuple[np.ndarray | None, Spend | None, SoloAnswers | None, str]:
        """A cache file's scores, cost and (one-member coalitions) member's answers, validated (this coalition's
        key and questions, one finite score in [0, 1] per question, a :class:`Spend` record, answers whose
        scores average to the scores), or ``(None, None, None, what is wrong)``; answers are ``None`` when the
        file has none."""
        record, scores, spend, problem = self._read_scores(path, mask)
        if problem:
            return None, None, None, problem
        if "solo" not in record:
            return scores, spend, None, ""
        solo, problem = SoloAnswers.from_dict(record["solo"], len(self.example_ids), self.samples)
        if not problem and not (mask and not mask & (mask - 1)):
            problem = "it holds a member's answers but is not a one-member coalition"
        if not problem and not np.array_equal(_sample_mean(solo.scores), scores):
            problem = "its member's answers' scores do not average to its scores"
        return (None, None, None, problem) if problem else (scores, spend, solo, "")

    def _read_scores(self, path: Path, mask: int) -> tuple[dict, np.ndarray | None, Spend | None, str]:
        """A cache file's record, scores and cost, validated (this coalition's key and questions, one finite
        score in [0, 1] per question, a :class:`Spend` record), or ``({}, None, None, what is wrong)``."""
        try:
            record = read_json(path)  # a regular file only: a FIFO planted here must not hang us
        except (OSError, ValueError) as e:  # JSON errors, bad UTF-8 and too many digits are ValueErrors
            return {}, None, None, f"unreadable ({type(e).__name__})"
        if not isinstance(record, dict):
            return {}, None, None, f"holds a {type(record).__name__}, not a coalition record"
        if record.get("key") != self.coalition_key(mask):
            return {}, None, None, "its key is not this coalition's"
        if record.get("example_ids") != self.example_ids:
            return {}, None, None, "its questions are not this game's"
        raw = record.get("scores")
        if not isinstance(raw, list) or len(raw) != len(self.example_ids):
            return {}, None, None, (f"{len(raw) if isinstance(raw, list) else 'no'} scores for "
                                f"{len(self.example_ids)} questions")
        problem = numbers_problem("its scores", raw, (len(self.example_ids),), low=0, high=1)
        if problem:  # a string, NaN, 7.0 or a 400-digit integer (too large for a float): refused, not raised
            return {}, None, None, problem
        scores = np.asarray(raw, dtype=float)
        spend, problem = Spend.from_dict(record.get("spend"), len(self.example_ids))
        if problem:
            return {}, None, None, problem
        return record, scores, spend, ""

    def _check_masks(self, masks: Iterable[int]) -> list[int]:
        masks = list(dict.fromkeys(int(m) for m in masks))
        full = (1 << self.n) - 1
        for m in masks:
            if not 0 <= m <= full:
                raise ConfigError(f"coalition mask {m} out of range for a pool of {self.n}")
        return masks

    def run_spec(self) -> CoalitionRun:
        """What a coalition run needs besides the mask (what executors ship to their workers)."""
        return CoalitionRun(self.factory, self.pool, self.task, self.samples, self.seed, self.sampling,
                            self.options, list(self.example_ids), memo=self.memo)

    def store(self, mask: int, scores: np.ndarray, spend: Spend, solo: SoloAnswers | None = None) -> None:
        """Record a coalition's executed run (its scores, what it cost and, for one member, what it answered):
        in memory, and on disk in one atomic write (a reader sees no file or the whole file). Only the process
        that owns the game (the driver) writes."""
        scores = np.asarray(scores, dtype=float)
        if scores.shape != (len(self.example_ids),):
            raise ConfigError(f"coalition {mask}: {scores.shape} scores for {len(self.example_ids)} questions")
        self._memory[mask], self._spend[mask] = scores, spend
        if solo is not None:
            self._solo[mask] = solo
        self.evaluations += 1
        path = self._path(mask)
        if path is not None:
            atomic_write_json(path, {
                "key": self.coalition_key(mask), "version": CACHE_VERSION,
                "coalition": [self.ids[i] for i in members_of(mask, self.n)],
                "describe": self.describe_coalition(mask), "protocol": self.protocol_name,
                "empty_value": self.empty_value, "example_ids": self.example_ids, "scores": scores.tolist(),
                "spend": spend.to_dict(), **({} if solo is None else {"solo": solo.to_dict()}),
            })

    def __repr__(self) -> str:
        return f"CoalitionGame({self.protocol_name}, {self.pool!r}, {self.task!r}, key={self.key[:12]})"


def _sample_mean(scores: np.ndarray) -> np.ndarray:
    """Per-question means of ``(questions, samples)`` scores, summed in sample order as a played run sums them."""
    totals = np.zeros(scores.shape[0])
    for s in range(scores.shape[1]):
        totals += scores[:, s]
    return totals / scores.shape[1]


def play_coalitions(jobs: Sequence[tuple[CoalitionGame, Iterable[int]]]) -> list[tuple[CoalitionGame, int]]:
    """Play every missing coalition of every ``(game, masks)`` job, all submitted together to the
    first game's executor (so a cluster stays busy across games), each result stored by its game as
    it arrives. Returns the ``(game, mask)`` runs executed."""
    todo: list[tuple[CoalitionGame, int]] = []
    for game, masks in jobs:
        todo += [(game, m) for m in game.missing(masks) if (game, m) not in todo]
    if not todo:
        return []
    game0 = todo[0][0]
    bar = _RunBar(todo, disable=not game0.progress)
    try:
        game0.executor.run(todo, lambda game, mask, outcome: (game.store(mask, *outcome), bar.finished(game, mask)),
                           bar=bar)
    finally:
        bar.close()
    return todo


def _run_weights(todo: Sequence[tuple[CoalitionGame, int]]) -> dict[tuple[int, int], float]:
    """Each run's share of the model calls that will really run: the calls of all runs with the request
    memo (:func:`~crl_envs.valuation.cost.distinct_calls`, over the runs of games sharing a pool, task
    and samples), split over the runs in proportion to their calls without it (:meth:`CoalitionGame.cost`)."""
    full = {(id(g), m): g.cost(m) * len(g.example_ids) * g.samples for g, m in todo}
    shared: dict[tuple, list[tuple[CoalitionGame, int]]] = {}
    for g, m in todo:
        shared.setdefault((g.pool.fingerprint, g.task.fingerprint, tuple(g.example_ids), g.samples, g.seed,
                           g.memo), []).append((g, m))
    weights = {}
    for runs in shared.values():
        g0 = runs[0][0]
        total = sum(full[id(g), m] for g, m in runs)
        try:
            actual = distinct_calls([(g.factory, g.options, m) for g, m in runs], g0.pool.names,
                                    len(g0.example_ids), g0.samples,
                                    memoised=[g0.memo and g0.pool[a].deterministic for a in g0.ids])
        except Exception:  # a protocol the stand-ins cannot play: every call counted
            actual = total
        for g, m in runs:
            weights[id(g), m] = full[id(g), m] * (actual / total if total else 1.0)
    return weights


class _RunBar:
    """A progress bar over coalition runs, labelled by what they are (``debate_v0: 31 coalitions + 5
    models alone``) and advanced by each run's share of the model calls that will really run
    (:func:`_run_weights`: distinct requests, as the request memo generates each once), so its total
    estimates the calls and its ETA holds when cheap one-model runs finish first. ``set_postfix_str``
    keeps the run count in front of an executor's status."""

    def __init__(self, todo: Sequence[tuple[CoalitionGame, int]], disable: bool):
        self.total = len(todo)
        self.done = 0
        alone = [(g, m) for g, m in todo if g.protocol_name == INDIVIDUAL_PROTOCOL_NAME and bin(m).count("1") == 1]
        systems = [(g, m) for g, m in todo if (g, m) not in alone]
        parts = []
        if systems:
            names = "+".join(dict.fromkeys(g.protocol_name for g, _ in systems))
            parts.append(f"{names}: {len(systems)} coalition{'s' * (len(systems) != 1)}")
        if alone:
            parts.append(f"{len(alone)} model{'s' * (len(alone) != 1)} alone")
        self.weight = _run_weights(todo) if not disable else {}
        self.bar = tqdm(total=round(sum(self.weight.values()), 3) or self.total, desc=" + ".join(parts),
                        disable=disable, bar_format="{desc}: {percentage:3.0f}%|{bar}| est. model calls{postfix} [{elapsed}<{remaining}]")
        self.status = ""
        self._show()

    def _show(self) -> None:
        self.bar.set_postfix_str(f"{self.done}/{self.total} runs" + (f", {self.status}" if self.status else ""),
                                 refresh=True)

    def finished(self, game: CoalitionGame, mask: int) -> None:
        self.done += 1
        step = self.weight.get((id(game), mask), 1.0)
        self.bar.update(min(step, max(0.0, self.bar.total - self.bar.n)))  # float sums: never past the total
        self._show()

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.status = text
        self._show()

    def close(self) -> None:
        self.bar.close()


def individual_game(game: CoalitionGame) -> CoalitionGame:
    """The game whose one-member coalitions are each model answering the task alone, once.

    ``vote_v0`` with one member is exactly that: one ``answer`` phase with the task's prompt, the
    member's answer is the system's answer. The same pool, task, sampling, samples, seed and cache.
    """
    return CoalitionGame(
        INDIVIDUAL_PROTOCOL, game.pool, game.task, samples=game.samples, seed=game.seed,
        sampling=game.sampling, cache_dir=False if game.root is None else game.root,
        progress=game.progress, executor=game.executor, memo=game.memo,
    )


def _empty_value(env: Any, task: Task) -> float:
    """v(∅) from the protocol: a number, ``"chance"`` (the task's chance level) or a callable."""
    value = getattr(env, "empty_value", 0.0)
    if isinstance(value, str):
        if value != "chance":
            raise ConfigError(f"{type(env).__name__}.empty_value must be a number, 'chance' or a callable, got {value!r}")
        value = task.chance
    elif callable(value):
        value = value(task) if len(inspect.signature(value).parameters) else value()
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{type(env).__name__}.empty_value must lie in [0, 1], got {value}")
    return value


