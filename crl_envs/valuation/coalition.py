"""One coalition's run: what it needs (:class:`CoalitionRun`), how it is played
(:func:`coalitions_outcomes`: scores and cost, the one way, in this process or on a worker), and the JSON helpers its cache
uses. Imported by :mod:`~crl_envs.valuation.game` and :mod:`~crl_envs.valuation.executors`; it imports
neither, so the arrows run one way (game -> executors -> coalition)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agents import Agent, Pool, SamplingParams
from crl_envs.runner import DEFAULT_SAMPLING, ProtocolFactory, RequestMemo, run_coalitions
from crl_envs.tasks import Task
from crl_envs.valuation.spend import Spend, spend_of
from crl_kit.safe_io import atomic_write_json, read_json  # noqa: F401  (the caches' one reader and writer)
from crl_kit.serial import digest  # noqa: F401  (the one key digest; imported from here by the valuation cache)
from crl_kit.validation import numbers_problem


def members_of(mask: int, n: int) -> list[int]:
    """The member indices of a bitmask, in pool order."""
    return [i for i in range(n) if mask >> i & 1]


@dataclass
class CoalitionRun:
    """Everything a coalition's run depends on except the coalition: protocol factory, pool, task,
    samples, seed, sampling, protocol options and the example ids the scores are ordered by."""

    factory: ProtocolFactory
    pool: Pool
    task: Task
    samples: int
    seed: int
    sampling: SamplingParams | Mapping[str, SamplingParams] | None
    options: dict[str, Any]
    example_ids: list[str]
    memo: bool = True  # reuse identical requests' generations (:data:`MEMO`); results do not change


#: This process's request memo for coalition runs: a request shared by two coalitions (or two games,
#: or two study cells, in this process) is generated once. Keys hold everything that sets the answer.
#: 50,000 generations: the 12-protocol exact zoo valuation (5 models, 30 questions) needs 15,446.
MEMO = RequestMemo(max_entries=50_000)


def coalition_episodes(run: CoalitionRun, mask: int) -> list:
    """Play coalition ``mask`` through :func:`crl_envs.runner.run_coalitions` and return its episodes."""
    return coalitions_episodes(run, [mask])[0]


def coalitions_episodes(run: CoalitionRun, masks: list[int]) -> list[list]:
    """Play coalitions ``masks`` in lockstep (one batched call per agent per phase across all of them)."""
    ids = list(run.pool.ids)
    coalitions = [[ids[i] for i in members_of(mask, len(ids))] for mask in masks]
    return run_coalitions(run.factory, run.pool, run.task, coalitions, samples=run.samples, seed=run.seed,
                          sampling=run.sampling, options=run.options, progress=False,
                          memo=MEMO if run.memo else None)


def coalition_scores(run: CoalitionRun, mask: int) -> np.ndarray:
    """Play coalition ``mask``: per-question scores averaged over samples, in ``run.example_ids`` order."""
    return coalitions_outcomes(run, [mask])[0][0]


@dataclass(eq=False)
class SoloAnswers:
    """What a one-member coalition's member answered: per question, per sample, its extracted answer
    (``None``: unparseable) and that episode's score. A protocol that picks its answer from its members'
    independent answers (:attr:`crl_envs.protocols.base.ProtocolEnv.aggregate`) computes every coalition from these."""

    answers: list[list[str | None]]  # [question][sample]
    scores: np.ndarray  # (questions, samples)

    def to_dict(self) -> dict[str, Any]:
        return {"answers": self.answers, "scores": self.scores.tolist()}

    @classmethod
    def from_dict(cls, d: Any, questions: int, samples: int) -> tuple[SoloAnswers | None, str]:
        """The record :meth:`to_dict` wrote, validated (``questions`` x ``samples`` answers, each a str or
        null, and as many finite scores in [0, 1]), or ``(None, what is wrong)``."""
        if not isinstance(d, Mapping):
            return None, "its member's answers are not a record"
        answers, scores = d.get("answers"), d.get("scores")
        if not (isinstance(answers, list) and len(answers) == questions and all(
                isinstance(row, list) and len(row) == samples and all(a is None or isinstance(a, str) for a in row)
                for row in answers)):
            return None, f"its member's answers are not {questions} x {samples} strings or nulls"
        problem = numbers_problem("its member's scores", scores, (questions, samples), low=0, high=1)
        if problem:
            return None, problem
        return cls(answers, np.asarray(scores, dtype=float)), ""


def solo_answers(episodes: list, member: str, example_ids: list[str], samples: int) -> SoloAnswers:
    """The :class:`SoloAnswers` of ``member`` playing alone, from its coalition's episodes."""
    index = {eid: k for k, eid in enumerate(example_ids)}
    answers: list[list[str | None]] = [[None] * samples for _ in example_ids]
    scores = np.zeros((len(example_ids), samples))
    for ep in episodes:
        answers[index[ep.example_id]][ep.sample] = ep.answers.get(member)
        scores[index[ep.example_id], ep.sample] = ep.score
    return SoloAnswers(answers, scores)


def coalitions_outcomes(run: CoalitionRun, masks: list[int]) -> list[tuple[np.ndarray, Spend, SoloAnswers | None]]:
    """Each mask's per-question scores and :class:`~crl_envs.valuation.spend.Spend` (what it cost as
    deployed), the coalitions played in lockstep; both averaged over samples, in ``run.example_ids`` order;
    and, for a one-member coalition, what its member answered (:class:`SoloAnswers`; ``None`` for others)."""
    index = {eid: k for k, eid in enumerate(run.example_ids)}
    ids = list(run.pool.ids)
    out = []
    for mask, episodes in zip(masks, coalitions_episodes(run, list(masks))):
        totals = np.zeros(len(run.example_ids))
        for ep in episodes:
            totals[index[ep.example_id]] += ep.score
        solo = None
        if mask and not mask & (mask - 1):
            solo = solo_answers(episodes, ids[mask.bit_length() - 1], run.example_ids, run.samples)
        out.append((totals / run.samples, spend_of(episodes, run.example_ids, run.samples), solo))
    return out


def canonical(obj: Any) -> Any:
    """A JSON-able, order-independent form of options (agents by fingerprint, other objects by repr)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=_describe_object))


def _describe_object(obj: Any) -> str:
    return obj.fingerprint if isinstance(obj, Agent) else repr(obj)


def canonical_sampling(sampling: SamplingParams | Mapping[str, SamplingParams] | None,
                       agent_ids: list[str] | None = None) -> Any:
    """Sampling settings as JSON; a per-agent mapping keeps only ``agent_ids`` (those that play)."""
    if sampling is None:
        return asdict(DEFAULT_SAMPLING)
    if isinstance(sampling, SamplingParams):
        return asdict(sampling)
    return {k: asdict(v) for k, v in sorted(sampling.items()) if agent_ids is None or k in agent_ids}
