"""The one rollout path: many env instances in lockstep, one batched call per Agent per phase.

Valuation, the trainers, the CLI and the examples all play episodes through :func:`run_episodes`
(one coalition) or :func:`run_coalitions` (several coalitions' episodes in lockstep, so a pool's
models see one batch of every coalition's requests per phase).

A :class:`RequestMemo` (valuation passes one) generates each distinct request once: coalitions
play the same questions with the same per-request seeds, so a model asked the same messages with the
same sampling and seed in two coalitions gives the same answer. Only agents that declare
``Agent.deterministic`` (their answer depends on the fingerprint, the messages and the sampling
alone, whatever the batch) are memoised.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from dataclasses import fields as dataclass_fields
from typing import Any

from tqdm.auto import tqdm

from agents import (
    Agent,
    Generation,
    Message,
    Pool,
    Request,
    RequestContext,
    SamplingParams,
    from_spec,
    stable_hash,
)
from agents import pool as make_pool
from crl_envs import protocols
from crl_envs import tasks as task_registry
from crl_envs.protocols.base import ProtocolEnv, Reply
from crl_envs.tasks import Example, Task
from crl_kit.errors import ConfigError, ConfigTypeError, CrlEnvsError, ModelError
from crl_kit.validation import check_int


@dataclass
class Usage:
    """What one agent spent: generation calls it answered, tokens, and wall seconds (its share of batches).

    ``calls``, the token counts and ``seconds`` are what the system costs as deployed (every answer
    counted, reused or not); ``generated_calls`` and ``generated_tokens`` count what this run
    actually generated: less when a :class:`RequestMemo` reused answers of identical requests."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    generated_calls: int = 0
    generated_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds
        self.generated_calls += other.generated_calls
        self.generated_tokens += other.generated_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TurnRecord:
    """One agent's answer in one phase. Token fields are filled for recorded agents only."""

    phase: int
    phase_name: str
    agent: str
    model: str
    messages: list[Message]
    text: str
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"


@dataclass
class Episode:
    """One played episode: the question, the system's answer and score, and everything said."""

    protocol: str
    example_id: str
    sample: int
    coalition: list[str]
    score: float
    answer: str | None
    reference: str
    answers: dict[str, str | None]
    standalone: dict[str, float]
    transcript: list[TurnRecord]
    usage: dict[str, Usage] = field(default_factory=dict)
    seed: int = 0

    def turns_of(self, agent: str) -> list[TurnRecord]:
        return [t for t in self.transcript if t.agent == agent]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ProtocolFactory = Callable[..., ProtocolEnv]


def total_usage(episodes: Sequence[Episode]) -> dict[str, Usage]:
    """Usage per agent id summed over episodes."""
    out: dict[str, Usage] = {}
    for ep in episodes:
        for agent, u in ep.usage.items():
            out.setdefault(agent, Usage()).add(u)
    return out


class RequestMemo:
    """Generations of distinct requests, each generated once and reused (a copy) for every identical request.

    The key of a request to ``model`` is a digest of ``model.fingerprint`` (weights, backend,
    settings), the exact messages and every sampling field (seed and stop strings included). Only
    agents whose class sets ``Agent.deterministic`` are memoised: their generation is a function of
    that key (the same in any batch). Others (vLLM, whose batched kernels are not batch-invariant;
    OpenAI-compatible servers, whose seeds are best effort; scripted agents, whose ``respond`` may
    keep state) are always generated.

    Args:
        max_entries: the most generations kept (the oldest are dropped first).
        greedy_only: memoise greedy requests (temperature 0) only, keyed without their seed: every
            deterministic backend decodes them by argmax and draws nothing from the seed
            (:func:`agents.sampling.sample_next`), so the G samples of a question ask a greedy partner
            once (a trainer's rollouts: :attr:`trainers.PolicyGradientTrainer.rollout_memo`). Sampled
            requests are then generated as without a memo (no fingerprint is taken for them).

    Counts: ``requests`` (memoisable requests seen), ``generated`` (of those, generated), ``reused``.
    """

    def __init__(self, max_entries: int = 200_000, *, greedy_only: bool = False):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigError(f"RequestMemo max_entries must be an int >= 1, got {max_entries!r}")
        self.max_entries = max_entries
        self.greedy_only = bool(greedy_only)
        self._store: dict[str, Generation] = {}
        self.requests = 0
        self.generated = 0

    @property
    def reused(self) -> int:
        return self.requests - self.generated

    def __len__(self) -> int:
        return len(self._store)

    def admits(self, request: Request) -> bool:
        """Whether ``request`` (to a deterministic agent) is memoised: every one, or with :attr:`greedy_only` a
        greedy one."""
        return not self.greedy_only or request.sampling.temperature == 0

    def key(self, fingerprint: str, request: Request) -> str:
        """The memo key of ``request`` to the agent with ``fingerprint`` (with :attr:`greedy_only`, without the
        seed, which a greedy answer does not read)."""
        sampling = request.sampling.with_seed(None) if self.greedy_only else request.sampling
        return _key(fingerprint, request.messages, sampling)

    def get(self, key: str) -> Generation | None:
        """A copy of the generation stored under ``key`` (None when absent)."""
        gen = self._store.get(key)
        return None if gen is None else _copy_generation(gen)

    def put(self, key: str, gen: Generation) -> None:
        """Keep a copy of ``gen`` under ``key``."""
        self._store[key] = _copy_generation(gen)
        while len(self._store) > self.max_entries:
            del self._store[next(iter(self._store))]

    def clear(self) -> None:
        self._store.clear()

    def __repr__(self) -> str:
        return f"RequestMemo({len(self)} generations, {self.requests} requests, {self.generated} generated)"


def request_key(fingerprint: str, request: Request) -> str:
    """A digest of everything that sets a deterministic agent's answer: its fingerprint, the messages
    (roles and contents, in order) and every sampling field."""
    return _key(fingerprint, request.messages, request.sampling)


#: SamplingParams' field names, in order (a request key names every one)
_SAMPLING_FIELDS = tuple(f.name for f in dataclass_fields(SamplingParams))


def _key(fingerprint: str, messages: Any, sampling: SamplingParams) -> str:
    """:func:`request_key` of these messages and sampling settings."""
    import hashlib
    import json

    # the fields as dataclasses.asdict gives them (flat: numbers, None, a tuple of str), without its deep copy
    fields = {name: getattr(sampling, name) for name in _SAMPLING_FIELDS}
    payload = json.dumps([fingerprint, messages, fields], sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(payload.encode(), digest_size=16).hexdigest()


def _copy_generation(gen: Generation) -> Generation:
    """A copy whose lists are not shared (a caller may edit an episode's token ids)."""
    return replace(gen, token_ids=None if gen.token_ids is None else list(gen.token_ids),
                   logprobs=None if gen.logprobs is None else list(gen.logprobs),
                   prompt_token_ids=None if gen.prompt_token_ids is None else list(gen.prompt_token_ids))


def run_episodes(
    protocol: ProtocolFactory | str | ProtocolEnv,
    pool: Pool | Sequence[Agent | str] | str | None = None,
    task: Task | str | None = None,
    *,
    coalition: Sequence[str | int] | None = None,
    samples: int = 1,
    seed: int = 0,
    policies: Mapping[str, Agent | str] | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
    examples: Sequence[int | str] | None = None,
    options: Mapping[str, Any] | None = None,
    record: Sequence[str] | None = None,
    memo: RequestMemo | None = None,
) -> list[Episode]:
    """Play every (example, sample) pair of ``task`` under ``protocol``, in lockstep.

    Args:
        protocol: a factory such as ``crl_envs.debate_v0``, a protocol name (``"debate"``), or an env
            made by one (``crl_envs.debate_v0(pool, task, rounds=3)``): a template whose protocol,
            pool, task and options are played (``pool``, ``task`` and ``options`` may then be left out;
            one that differs from the env's is an error).
        pool: the models; ``task``: a Task or a task name.
        coalition: the members taking part (all by default).
        samples: episodes per question; sample ``k`` gets its own sampling seeds.
        seed: the run's seed; every request's sampling seed derives from it, the example, the
            sample, the agent and the phase, so results do not depend on batching.
        policies: ``agent id -> Agent`` overrides (e.g. the learner's current policy); a spec string
            (``"hf:path"``, ``"zoo:zoo-small"``) is built with :func:`agents.from_spec` once per call.
        batch_size: the most requests in one ``generate`` call (default: all of a phase).
        sampling: sampling settings, for all agents or per agent id (default: greedy, 256 tokens).
        examples: indices or ids of the task's examples to play (default: all).
        options: keyword arguments for the protocol factory (e.g. ``{"rounds": 3}``); checked against
            the protocol's valid options before anything runs.
        record: agent ids whose token ids and log-probs are kept (default: the overridden ones).
        memo: a :class:`RequestMemo`: each distinct request of a deterministic agent generated once
            (results identical; ``Usage.generated_calls`` counts what ran).

    Returns:
        Episodes ordered by example, then sample.
    """
    return run_coalitions(protocol, pool, task, [coalition], samples=samples, seed=seed, policies=policies,
                          batch_size=batch_size, progress=progress, sampling=sampling, examples=examples,
                          options=options, record=record, memo=memo)[0]


def run_coalitions(
    protocol: ProtocolFactory | str | ProtocolEnv,
    pool: Pool | Sequence[Agent | str] | str | None,
    task: Task | str | None,
    coalitions: Sequence[Sequence[str | int] | None],
    *,
    samples: int = 1,
    seed: int = 0,
    policies: Mapping[str, Agent | str] | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
    examples: Sequence[int | str] | None = None,
    options: Mapping[str, Any] | None = None,
    record: Sequence[str] | None = None,
    memo: RequestMemo | None = None,
) -> list[list[Episode]]:
    """:func:`run_episodes` for several coalitions at once: every coalition's episodes play in lockstep,
    one batched call per agent per phase across all of them. Each coalition's episodes are exactly
    those :func:`run_episodes` plays for it alone (request seeds never depend on the coalition).

    Args:
        coalitions: the coalitions (each a list of members, or None for everyone).
        Others: as in :func:`run_episodes` (``pool`` and ``task`` may be None when ``protocol`` is an env).

    Returns:
        One list of episodes per coalition, each ordered by example, then sample.

    Raises:
        TypeError, ValueError: a malformed argument, before any model is built or token generated.
    """
    run = _prepare_run(protocol, pool, task, coalitions, samples=samples, seed=seed, policies=policies,
                       batch_size=batch_size, sampling=sampling, examples=examples, options=options,
                       record=record, memo=memo)
    steppers = [stepper for coalition in coalitions for stepper in _start(run, coalition)]
    protocol_name = steppers[0].env.metadata["name"] if steppers else getattr(run.factory, "__name__", str(protocol))
    if steppers:
        _check_sampled_agents(run.sampling, steppers[0].env, protocol_name)
    what = f"{len(steppers)} episodes" + (f" of {len(coalitions)} coalitions" if len(coalitions) > 1 else "")
    _play(run, steppers, description=f"{protocol_name}, {what}", progress=progress)
    episodes = [stepper.episode() for stepper in steppers]
    per = len(run.examples) * run.samples
    return [episodes[k * per : (k + 1) * per] for k in range(len(coalitions))]


@dataclass
class _Run:
    """One call's checked settings: what every episode of it plays with."""

    factory: ProtocolFactory
    pool: Pool
    task: Task
    options: dict[str, Any]
    examples: list[Example]
    samples: int
    seed: int
    batch_size: int | None
    sampling: SamplingParams | Mapping[str, SamplingParams] | None
    policies: dict[str, Agent]
    recorded: set[str]
    memo: RequestMemo | None


class EpisodeStepper:
    """One episode played a phase at a time: the one episode driver.

    :attr:`requests` are the generation requests the current phase needs, ``(agent id, model,
    request)`` in the env's agent order; :meth:`give` takes their generations (in that order), steps
    the env and moves to the next phase; :attr:`done` says when the episode is over and
    :meth:`episode` returns it. :func:`run_coalitions` steps many in lockstep (one batched call per
    model per phase across all of them); the learner's seat (:mod:`crl_envs.integrations.seat`) and
    the SB3 wrapper step one at a time. Each turn's finish reason reaches the env with its action
    (a :class:`~crl_envs.protocols.base.Reply`).

    Args:
        env: a protocol env (the stepper resets it); ``example``: the question.
        sample: the episode's index among the question's samples.
        coalition: the members taking part (all by default).
        seed: the run's seed: the env's seed derives from (seed, example, sample), every request's
            sampling seed from (seed, example, sample, agent, phase).
        policies: ``agent id -> Agent`` overrides; ``sampling``: as in :func:`run_episodes`.
        record: agent ids whose token ids and log-probs are kept (default: the overridden ones).

    Example:
        >>> import agents, crl_envs
        >>> pool = agents.pool([agents.ScriptedAgent.expert(f"expert-{a}", a) for a in (0.9, 0.6, 0.3)])
        >>> task = crl_envs.tasks.load("arith", n=2)
        >>> stepper = EpisodeStepper(crl_envs.vote_v0(pool, task), task[0])
        >>> while not stepper.done:
        ...     stepper.give(generate_grouped([(model, request) for _, model, request in stepper.requests]))
        >>> episode = stepper.episode()
        >>> len(episode.transcript), episode.score == run_episodes("vote", pool, task, examples=[0])[0].score
        (3, True)
    """

    def __init__(self, env: ProtocolEnv, example: Example, sample: int = 0, *,
                 coalition: Sequence[str | int] | None = None, seed: int = 0,
                 policies: Mapping[str, Agent] | None = None,
                 sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
                 record: Sequence[str] | None = None):
        self.env, self.example, self.sample, self.seed = env, example, sample, seed
        self.policies = dict(policies or {})
        self.sampling = sampling
        self.recorded = set(self.policies) if record is None else set(record)
        self.transcript: list[TurnRecord] = []
        self.usage: dict[str, Usage] = {}
        #: what the env returned last (PettingZoo's dicts): observations, infos and the step's rewards
        self.observations, self.infos = env.reset(seed=stable_hash(seed, example.id, sample) % (2**32),
                                                  options={"coalition": coalition, "example": example})
        self.rewards: dict[str, float] = {}
        self._requests = self._plan()

    @property
    def done(self) -> bool:
        """Whether the episode is over."""
        return not self.env.agents

    @property
    def requests(self) -> list[tuple[str, Agent, Request]]:
        """``(agent id, model, request)`` for every turn of the current phase (empty once done)."""
        return list(self._requests)

    def give(self, generations: Sequence[Generation], *, generated: Sequence[bool] | None = None,
             actions: Mapping[str, Any] | None = None) -> None:
        """Answer the current phase and step the env.

        Args:
            generations: one per request of :attr:`requests` (less those of ``actions``), in order.
            generated: for each generation, whether it was generated (False: reused from a memo);
                counted in the usage. All True by default.
            actions: raw actions of agents the caller plays itself (an SB3 policy's choice), by agent id.

        Raises:
            ValueError: the generations do not match the requests.
        """
        actions = dict(actions or {})
        answered = [call for call in self._requests if call[0] not in actions]
        if set(actions) - {agent_id for agent_id, _, _ in self._requests}:
            raise ConfigError(f"actions name agents {sorted(actions)} but the phase waits for "
                              f"{[a for a, _, _ in self._requests]}")
        if len(generations) != len(answered) or (generated is not None and len(generated) != len(generations)):
            raise ConfigError(f"{len(generations)} generations for {len(answered)} requests of phase "
                              f"{self.env.phase.name!r}: give one generation per request, in order")
        fresh = iter([True] * len(generations) if generated is None else generated)
        given = iter(generations)
        for agent_id, model, request in self._requests:
            if agent_id in actions:  # in the transcript as the env reads it; no generation, no usage
                self._record(agent_id, model, request, Generation(str(actions[agent_id]), completion_tokens=0),
                             generated=False, usage=False)
                continue
            gen = next(given)
            self._record(agent_id, model, request, gen, generated=next(fresh))
            actions[agent_id] = Reply(gen.text, gen.finish_reason)
        self.observations, self.rewards, _, _, self.infos = self.env.step(actions)
        self._requests = self._plan()

    def play_phase(self, *, memo: RequestMemo | None = None, batch_size: int | None = None) -> None:
        """Generate the current phase's requests (one batched call per model, as
        :func:`generate_grouped`) and :meth:`give` them: stepping one episode on its own."""
        gens, fresh = _generate([(model, request) for _, model, request in self._requests], batch_size=batch_size,
                                memo=memo)
        self.give(gens, generated=fresh)

    def episode(self) -> Episode:
        """The finished episode."""
        if not self.done:
            raise RuntimeError("episode() before the episode ended: give the generations of every phase first")
        outcome = self.env.outcome
        return Episode(
            protocol=self.env.metadata["name"],
            example_id=self.example.id,
            sample=self.sample,
            coalition=list(self.env.members),
            score=float(outcome.score),
            answer=outcome.answer,
            reference=self.example.answer,
            answers=dict(outcome.answers),
            standalone=dict(outcome.standalone),
            transcript=self.transcript,
            usage=self.usage,
            seed=self.seed,
        )

    def _plan(self) -> list[tuple[str, Agent, Request]]:
        return phase_requests(self.env, None, self.example, self.sample, seed=self.seed, policies=self.policies,
                              sampling=self.sampling)

    def _record(self, agent_id: str, model: Agent, request: Request, gen: Generation, *, generated: bool,
                usage: bool = True) -> None:
        """One answer of the current phase: kept for the transcript and (``usage``) the usage."""
        keep_tokens = agent_id in self.recorded
        self.transcript.append(
            TurnRecord(
                phase=request.context.phase_index,
                phase_name=request.context.phase,
                agent=agent_id,
                model=model.name,
                messages=request.messages,
                text=gen.text[: self.env.max_action_chars],
                prompt_token_ids=gen.prompt_token_ids if keep_tokens else None,
                token_ids=gen.token_ids if keep_tokens else None,
                logprobs=gen.logprobs if keep_tokens else None,
                finish_reason=gen.finish_reason,
            )
        )
        if usage:
            self.usage.setdefault(agent_id, Usage()).add(
                Usage(1, gen.prompt_tokens, gen.completion_tokens, gen.seconds, int(generated),
                      gen.completion_tokens if generated else 0))


def _prepare_run(
    protocol: ProtocolFactory | str | ProtocolEnv,
    pool: Pool | Sequence[Agent | str] | str | None,
    task: Task | str | None,
    coalitions: Any,
    *,
    samples: Any,
    seed: Any,
    policies: Any,
    batch_size: Any,
    sampling: Any,
    examples: Sequence[int | str] | None,
    options: Any,
    record: Sequence[str] | None,
    memo: Any,
) -> _Run:
    """Every argument checked, then the pool, the task, the examples and the policies built: nothing
    generates a token before this has passed."""
    factory, pool, task, options = _protocol_parts(protocol, pool, task, options)
    samples = check_int("samples", samples, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1, allow_none=True)
    seed = check_int("seed", seed)
    _check_options_type(options)
    options = dict(options or {})
    protocols.check_options(factory, options)
    _check_sampling(sampling)
    if policies is not None and not isinstance(policies, Mapping):
        raise ConfigTypeError(f"policies must be a dict agent id -> Agent or spec string, got {type(policies).__name__}")
    if memo is not None and not isinstance(memo, RequestMemo):
        raise ConfigTypeError(f"memo must be a crl_envs.runner.RequestMemo or None, got {type(memo).__name__}")
    if isinstance(coalitions, (str, bytes)) or not isinstance(coalitions, Sequence):
        raise ConfigTypeError(f"coalitions must be a list of coalitions (each a list of members or None), got {coalitions!r}")
    if pool is None or task is None:
        raise ConfigTypeError(f"run_episodes needs a pool and a task (got pool={pool!r}, task={task!r}), or an env "
                              f"as the protocol, e.g. run_episodes(crl_envs.debate_v0(pool, task, rounds=2))")
    pool = pool if isinstance(pool, Pool) else make_pool(pool)
    task = task if isinstance(task, Task) else task_registry.load(task)
    unknown = set(policies or {}) - set(pool.ids)
    if unknown:
        raise ConfigError(f"policies name unknown agents {sorted(unknown)}; pool agents are {pool.ids}")
    chosen = _select_examples(task, examples)
    policies = {agent_id: _policy(agent_id, p) for agent_id, p in (policies or {}).items()}
    recorded = set(record) if record is not None else set(policies)
    return _Run(factory=factory, pool=pool, task=task, options=options, examples=chosen, samples=samples, seed=seed,
                batch_size=batch_size, sampling=sampling, policies=policies, recorded=recorded, memo=memo)


def _protocol_parts(protocol: Any, pool: Any, task: Any, options: Any) -> tuple[ProtocolFactory, Any, Any, Any]:
    """``(factory, pool, task, options)``: the arguments as given for a factory or a protocol name; for
    an env (a template), the factory, pool, task and options that made it."""
    if not isinstance(protocol, ProtocolEnv):
        return protocols.get(protocol), pool, task, options
    _check_options_type(options)
    made = protocol.env_options
    conflicts = [name for name, given, own in (("pool", pool, protocol.pool), ("task", task, protocol.task))
                 if given is not None and not _same(given, own)]
    differing = sorted(k for k in (options or {}) if k not in made or not _same(options[k], made[k]))
    if differing:
        conflicts.append(f"options {differing}")
    if conflicts:
        name = protocol.metadata["name"]
        raise ConfigError(f"the protocol is a {name} env, which plays its own pool, task and options; these "
                          f"arguments differ from the env's: {', '.join(conflicts)}. Pass the env alone, or "
                          f"crl_envs.{name} with pool, task and options")
    cls = type(protocol)
    factory = next((f for f in protocols.PROTOCOLS.values() if protocols.env_class(f) is cls), cls)
    return factory, protocol.pool, protocol.task, made


def _same(a: Any, b: Any) -> bool:
    """Whether two arguments are the same (``==`` where it gives one truth value: a pool of the same
    agents is the env's pool)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # e.g. numpy arrays: no single truth value, so not known to be the same
        return False


def _check_options_type(options: Any) -> None:
    if options is not None and not isinstance(options, Mapping):
        raise ConfigTypeError(f"options must be a dict of protocol options (e.g. {{'rounds': 3}}), got {type(options).__name__}")


def _start(run: _Run, coalition: Sequence[str | int] | None) -> list[EpisodeStepper]:
    """One episode per (example, sample) of ``coalition``, in that order."""
    return [EpisodeStepper(run.factory(run.pool, run.task, **run.options), example, sample, coalition=coalition,
                           seed=run.seed, policies=run.policies, sampling=run.sampling, record=run.recorded)
            for example in run.examples for sample in range(run.samples)]


def _check_sampled_agents(sampling: Any, env: ProtocolEnv, protocol_name: str) -> None:
    """Per-agent ``sampling`` may name only the protocol's agents."""
    if isinstance(sampling, Mapping):
        stray = set(sampling) - set(env.possible_agents)
        if stray:
            raise ConfigError(f"sampling names unknown agents {sorted(stray)}; agents of {protocol_name} are "
                             f"{env.possible_agents}")


def _play(run: _Run, steppers: list[EpisodeStepper], *, description: str, progress: bool) -> None:
    """Play every episode to its end, phase by phase: each phase one batched call per model across the
    live episodes, then every live episode stepped.

    The bar counts generated tokens, after every model's batched call: in lockstep every episode ends
    in the last phase, so a count of finished episodes would sit at 0 and then jump to the end."""
    fingerprints: dict[int, str] = {}  # per model, once per call (an HF fingerprint hashes the weights)
    bar = tqdm(desc=description, unit="tok", unit_scale=True, disable=not progress, leave=False)
    live = [stepper for stepper in steppers if not stepper.done]
    while live:
        asked = [stepper.requests for stepper in live]
        calls = [(model, request) for requests in asked for _, model, request in requests]
        phase_names = sorted({request.context.phase for _, request in calls})
        bar.set_postfix_str(f"phase {'/'.join(phase_names)}, {len(steppers) - len(live)}/{len(steppers)} episodes done")
        gens, fresh = _generate(calls, batch_size=run.batch_size, memo=run.memo, fingerprints=fingerprints,
                                on_batch=lambda done: bar.update(sum(g.completion_tokens for g in done)))
        start = 0
        for stepper, requests in zip(live, asked):
            stepper.give(gens[start : start + len(requests)], generated=fresh[start : start + len(requests)])
            start += len(requests)
        live = [stepper for stepper in live if not stepper.done]
    bar.set_postfix_str(f"{len(steppers)}/{len(steppers)} episodes done")
    bar.close()


def phase_requests(
    env: ProtocolEnv,
    infos: Mapping[str, Any] | None = None,
    example: Example | None = None,
    sample: int = 0,
    *,
    seed: int = 0,
    policies: Mapping[str, Agent | str] | None = None,
    sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
) -> list[tuple[str, Agent, Request]]:
    """``(agent id, model, request)`` for every turn ``env``'s current phase waits for
    (:meth:`ProtocolEnv.pending_turns`), in the env's agent order.

    ``infos`` (keyed by agent id, e.g. PettingZoo's infos less the agent a trainer plays) narrows the
    turns to the agents it names; ``example`` defaults to ``env.example``. A request's sampling seed
    derives from (seed, example, sample, agent, phase), never from batching.
    """
    example = env.example if example is None else example
    out = []
    for turn in env.pending_turns():
        if infos is not None and turn.agent_id not in infos:
            continue
        model = (policies or {}).get(turn.agent_id) or env.agent_for(turn.agent_id)
        seed_k = stable_hash(seed, example.id, sample, turn.agent_id, turn.phase_index) % (2**63)
        context = RequestContext(example=example, protocol=env.metadata["name"], phase=turn.phase,
                                 phase_index=turn.phase_index, agent_id=turn.agent_id, sample=sample)
        out.append((turn.agent_id, model,
                    Request(turn.messages, _sampling_for(sampling, turn.agent_id).with_seed(seed_k), context=context)))
    return out


def generate_grouped(
    items: Sequence[tuple[Agent, Request]],
    *,
    batch_size: int | None = None,
    on_batch: Callable[[list[Generation]], None] | None = None,
    memo: RequestMemo | None = None,
) -> list[Generation]:
    """One generation per ``(model, request)``, in order, with one batched ``generate`` per model
    (split into ``batch_size`` chunks if given). ``Generation.seconds`` is each request's share;
    ``on_batch`` (e.g. a progress bar) sees each batch's generations as soon as they are done.
    With a ``memo``, a deterministic agent's request identical to one already answered (in the memo
    or earlier in ``items``) is not generated again: it gets a copy of that answer."""
    return _generate(items, batch_size=batch_size, on_batch=on_batch, memo=memo)[0]


def _generate(
    items: Sequence[tuple[Agent, Request]],
    *,
    batch_size: int | None = None,
    on_batch: Callable[[list[Generation]], None] | None = None,
    memo: RequestMemo | None = None,
    fingerprints: dict[int, str] | None = None,
) -> tuple[list[Generation], list[bool]]:
    """:func:`generate_grouped`, and for each item whether it was generated (False: reused from ``memo``)."""
    out: list[Generation | None] = [None] * len(items)
    fresh = [True] * len(items)
    keys: list[str | None] = [None] * len(items)
    todo: list[int] = []
    first: dict[str, int] = {}  # key -> the position that generates it
    made: dict[str, Generation] = {}  # key -> its generation in this call
    fingerprints = {} if fingerprints is None else fingerprints
    for k, (model, request) in enumerate(items):
        if memo is None or not getattr(model, "deterministic", False) or not memo.admits(request):
            todo.append(k)
            continue
        if id(model) not in fingerprints:
            fingerprints[id(model)] = model.fingerprint
        key = keys[k] = memo.key(fingerprints[id(model)], request)
        memo.requests += 1
        hit = memo.get(key)
        if hit is not None or key in first:
            fresh[k] = False
            out[k] = hit
            continue
        first[key] = k
        todo.append(k)
    groups: dict[int, tuple[Agent, list[int]]] = {}
    for k in todo:
        model = items[k][0]
        groups.setdefault(id(model), (model, []))[1].append(k)
    for model, positions in groups.values():
        step = batch_size or len(positions)
        for start in range(0, len(positions), step):
            chunk = positions[start : start + step]
            requests = [items[k][1] for k in chunk]
            t0 = time.perf_counter()
            try:
                gens = model.generate(requests)
            except Exception as e:
                first = requests[0].context
                # a failure the model surfaced (its message names the fix) stays a library error; anything
                # else is a bug and keeps its traceback, chained under this line
                failed = ModelError if isinstance(e, (CrlEnvsError, OSError)) else RuntimeError
                raise failed(
                    f"agent {first.agent_id} ({model.name}) failed on a batch of {len(requests)} requests "
                    f"(first example {getattr(first.example, 'id', None)!r}, phase {first.phase!r}): {e}"
                ) from e
            share = (time.perf_counter() - t0) / len(requests)
            for k, g in zip(chunk, gens):
                g.seconds = share
                out[k] = g
                if keys[k] is not None:
                    made[keys[k]] = g  # type: ignore[index]
                    memo.put(keys[k], g)  # type: ignore[union-attr]
                    memo.generated += 1  # type: ignore[union-attr]
            if on_batch is not None:
                on_batch(list(gens))
    for k in range(len(items)):
        if out[k] is None:  # an identical request earlier in this call
            out[k] = _copy_generation(made[keys[k]])  # type: ignore[index]
    return out, fresh  # type: ignore[return-value]


def _select_examples(task: Task, examples: Sequence[int | str] | None) -> list[Example]:
    if examples is None:
        return list(task.examples)
    if isinstance(examples, (str, int, Example)):
        raise ConfigTypeError(f"examples must be a list of indices or example ids, got {examples!r}; "
                        f"e.g. examples=[{examples!r}]")
    out = []
    for e in examples:
        if isinstance(e, Example):
            out.append(e)
        elif isinstance(e, str):
            out.append(task.by_id(e))
        elif isinstance(e, numbers.Integral) and not isinstance(e, bool):
            if not 0 <= int(e) < len(task):
                raise ConfigError(f"example index {e} out of range for a task of {len(task)} (valid: 0..{len(task) - 1})")
            out.append(task[int(e)])
        else:
            raise ConfigTypeError(f"examples must hold int indices, example ids (str) or Examples; got {e!r} "
                            f"({type(e).__name__}): pass examples=[int(i) for i in ...] for indices")
    return out


def _check_sampling(sampling: Any) -> None:
    """``None``, one ``SamplingParams``, or ``agent id -> SamplingParams``; anything else fails now."""
    if sampling is None or isinstance(sampling, SamplingParams):
        return
    if not isinstance(sampling, Mapping):
        raise ConfigTypeError(f"sampling must be a SamplingParams (for every agent) or a dict agent id -> SamplingParams, "
                        f"got {type(sampling).__name__}; e.g. sampling=SamplingParams(temperature=0.7)")
    for agent_id, params in sampling.items():
        if not isinstance(params, SamplingParams):
            example = f"SamplingParams(temperature={params!r})" if isinstance(params, (int, float)) else "SamplingParams(...)"
            raise ConfigTypeError(f"sampling[{agent_id!r}] must be a SamplingParams, got {params!r} "
                            f"({type(params).__name__}); e.g. sampling={{{agent_id!r}: {example}}}")


def _policy(agent_id: str, policy: Any) -> Agent:
    """A policy override as an Agent: spec strings are built with ``agents.from_spec``."""
    if isinstance(policy, Agent):
        return policy
    if isinstance(policy, str):
        return from_spec(policy)
    raise ConfigTypeError(f"policies[{agent_id!r}] must be an agents.Agent or a spec string such as 'hf:path/to/model', "
                    f"got {type(policy).__name__}")


DEFAULT_SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=256)


def _sampling_for(sampling: SamplingParams | Mapping[str, SamplingParams] | None, agent_id: str) -> SamplingParams:
    if sampling is None:
        return DEFAULT_SAMPLING
    if isinstance(sampling, SamplingParams):
        return sampling
    return sampling.get(agent_id, DEFAULT_SAMPLING)
