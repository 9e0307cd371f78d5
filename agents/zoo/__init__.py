"""The zoo: small causal LMs that ship with the library, so everything runs offline on a CPU.

Two generations: ``agents.pool("zoo")``, five arith specialists (below), and the multi-task zoo v3,
``agents.pool("zoo-specialists" | "zoo-generalists" | "zoo-scale" | "zoo-soloist")`` over the eight
procedural tasks (:data:`POOLS`; models in ``agents/zoo/models3/``, built by
``python -m tools.zoo.multitask``), plus ``agents.pool("zoo-pretrained")``, the real pretrained
pool, and the arith zoo v4's five pools of eight, ``agents.pool("zoo4-<shape>")`` (:data:`POOLS`; models in
``agents/zoo/models4/``, built by ``python -m tools.zoo.v4``), and four pools of 16 built from v4's
models, ``agents.pool("zoo16-<shape>")`` (:data:`agents.zoo.specs.POOLS16`, ``docs/pools16.md``). Their model cards are in
``docs/zoo.md``. This package reads only :mod:`agents.zoo.specs`;
the builders import :mod:`crl_envs` and are never imported by it.

``agents.pool("zoo")`` (or :func:`load`) returns a :class:`agents.Pool` of five character-level GPT-2s
(4 layers, width 64, 0.2M parameters each, 4.8 MB in all), loaded with ``from_pretrained`` from
``agents/zoo/models/<name>/`` and played through the ordinary :class:`agents.HFAgent`. They answer
``"The answer is N."``.

**Task.** The zoo is trained for ``crl_envs.tasks.load("arith", **agents.zoo.TASK_OPTIONS)``:
two-digit integer addition and subtraction (``"What is 47 + 85?"``), the task's default settings.
Other tasks are out of their depth (they score near 0 on anything else).

**Skills.** A shared base learned the format and the carry-free core; each specialist then saw the
full task except one question kind, its *blind spot*, which made up only 3% of its training mix.
They were trained on the prompts the protocols emit (answering alone, revising after reading 0..4
peers, aggregating and fusing proposals, picking the best candidate, routing, stating confidence):
see :mod:`tools.zoo.build`, which rebuilds them from a seed. Figures below: 500 arith test
questions, greedy, through ``crl_envs.run_episodes``; "LOO" is the leave-one-out contribution to
vote, v(N) - v(N minus the model). Vote beats the best model by 13.0 points (complementary blind
spots). Known weakness: debate's second round changes many answers but makes every model worse
(round 1 0.26-0.73, round 2 0.16-0.52): long prompts with peers are hard for these tiny models.

| model | blind spot | standalone | core | carry | hundreds | borrow | negative | LOO to vote |
|---|---|---|---|---|---|---|---|---|
| zoo-nocarry | carry | 0.732 | 0.85 | 0.36 | 0.62 | 0.85 | 0.83 | +0.086 |
| zoo-noborrow | borrow | 0.714 | 0.88 | 0.89 | 0.93 | 0.11 | 0.43 | +0.080 |
| zoo-small | hundreds | 0.694 | 0.91 | 0.46 | 0.01 | 0.91 | 0.90 | +0.046 |
| zoo-positive | negative | 0.650 | 0.87 | 0.81 | 0.81 | 0.39 | 0.04 | +0.078 |
| zoo-rookie | (none: brief training) | 0.264 | 0.65 | 0.17 | 0.03 | 0.09 | 0.04 | -0.010 |

On 500 arith test questions (seed 0, greedy): best single model 0.732; at least one model right 0.960; vote_v0 0.862; debate_v0 (2 rounds) 0.620; debate's round 2 changed 1318 of 2500 answers.

Example:
    >>> import agents, crl_envs
    >>> zoo = agents.pool("zoo")
    >>> task = crl_envs.tasks.load("arith", n=10, **agents.zoo.TASK_OPTIONS)
    >>> episodes = crl_envs.run_episodes(crl_envs.vote_v0, zoo, task, progress=False)
    >>> len(episodes), zoo.names[0]
    (10, 'zoo-nocarry')
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agents.pool import register_backend, register_pool
from agents.zoo.specs import NAMES3, NAMES4, POOL_SHAPES, POOLS3, POOLS4, POOLS16, SPECS, TASK_OPTIONS, TASKS3
from crl_kit.errors import ConfigError

MODELS_DIR = Path(__file__).resolve().parent / "models"
#: The multi-task models (v3) behind the ``zoo-<name>`` pools.
MODELS3_DIR = Path(__file__).resolve().parent / "models3"
#: The arith zoo v4 behind the ``zoo4-<shape>`` pools (not shipped yet: ``python -m tools.zoo.v4`` builds it).
MODELS4_DIR = Path(__file__).resolve().parent / "models4"
#: Model names in pool order.
NAMES: tuple[str, ...] = tuple(s.name for s in SPECS)
#: The pools ``agents.pool(name)`` builds from the zoo: ``"zoo"`` (arith), the v3 pools and the v4 pools.
POOLS: dict[str, tuple[str, ...]] = {"zoo": NAMES, **POOLS3, **POOLS4}
_DIRS = {**{n: MODELS_DIR for n in NAMES}, **{n: MODELS3_DIR for n in NAMES3}, **{n: MODELS4_DIR for n in NAMES4}}
_BUILDS = {MODELS_DIR: "tools.zoo.build", MODELS3_DIR: "tools.zoo.multitask", MODELS4_DIR: "tools.zoo.v4"}
#: The task settings the zoo is trained for: ``crl_envs.tasks.load("arith", **TASK_OPTIONS)``.
TASK = {"name": "arith", **TASK_OPTIONS}


def model_dir(name: str) -> Path:
    """The directory of a shipped zoo model."""
    if name not in _DIRS:
        raise ConfigError(f"unknown zoo model {name!r}; the zoo has {list(_DIRS)}")
    home = _DIRS[name]
    path = home / name
    if not (path / "config.json").exists():
        rebuild = f"python -m {_BUILDS[home]} --out {home}"
        if home == MODELS4_DIR:
            raise FileNotFoundError(f"zoo v4 model {name!r} is not built ({path} is missing); build zoo v4 with "
                                    f"`{rebuild}` (about an hour on 2 cores)")
        raise FileNotFoundError(f"zoo model {name!r} is missing from {path}; rebuild the zoo with `{rebuild}` "
                                "(or reinstall the package)")
    return path


def load(names: Sequence[str] | None = None, *, batch_size: int = 256):
    """The zoo as a :class:`agents.Pool` of :class:`agents.HFAgent` (all models, or ``names`` in that order)."""
    from transformers.utils import logging as hf_logging

    from agents.hf import HFAgent
    from agents.pool import Pool

    chosen = list(NAMES) if names is None else list(names)
    if not chosen:
        raise ConfigError("load(names=[]) asks for an empty zoo; pass None for all models or some of "
                         f"{list(NAMES)}")
    dirs = [model_dir(n) for n in chosen]
    # transformers draws a "Loading weights" bar per model (and one more per tokenizer): ten bars for a
    # pool that loads in about a second. Hidden while the zoo loads; the caller's setting is restored.
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        members = [HFAgent(d, name=n, batch_size=batch_size) for n, d in zip(chosen, dirs)]
        if batch_size == 256:  # what "zoo:<name>" builds: remembered, so Ray workers rebuild it from the spec
            for n, agent in zip(chosen, members):
                agent.spec = f"zoo:{n}"
        return Pool(members)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def agents_list(pool: str = "zoo") -> list:
    """The agents of a zoo pool in pool order (``agents.pool(pool)`` plays them), each remembering its spec."""
    if pool not in POOLS:
        raise ConfigError(f"unknown zoo pool {pool!r}; the zoo's pools are {list(POOLS)} and 'zoo-pretrained'")
    return list(load(POOLS[pool]).values())


def agents_list16(pool: str) -> list:
    """The seats of a pool of 16 (:data:`agents.zoo.specs.POOLS16`) in pool order: each v4 model loaded once,
    a sampled seat wrapped in :class:`agents.SampledAgent` (its own temperature; its seed is the seat's)."""
    from agents.base import SampledAgent

    if pool not in POOLS16:
        raise ConfigError(f"unknown pool of 16 {pool!r}; they are {list(POOLS16)}")
    seats = POOLS16[pool]
    models = dict(zip(dict.fromkeys(s.model for s in seats), load(list(dict.fromkeys(s.model for s in seats))).values()))
    return [models[s.model] if s.temperature == 0 else SampledAgent(models[s.model], s.temperature, name=s.label)
            for s in seats]


def _pool16_class(pool: str):
    """The class every seat of ``pool`` is, as a plan reads it: :class:`agents.SampledAgent` (never memoised)
    when any seat samples, else :class:`agents.HFAgent`."""
    if any(s.temperature > 0 for s in POOLS16[pool]):
        from agents.base import SampledAgent

        return SampledAgent
    return _hf_class()


def _pretrained_pool() -> list:
    from agents.pretrained import load as load_pretrained

    return load_pretrained()


def _agent_from_spec(name: str):
    """``agents.from_spec("zoo:<name>")``: one zoo model."""
    return load([name])["model_0"]


def _hf_class(*_: str):
    from agents.hf import HFAgent

    return HFAgent


register_pool("zoo", agents_list, _hf_class, size=len(POOLS["zoo"]))
for _pool in (*POOLS3, *POOLS4):
    register_pool(_pool, lambda _pool=_pool: agents_list(_pool), _hf_class, size=len(POOLS[_pool]))
for _pool in POOLS16:
    register_pool(_pool, lambda _pool=_pool: agents_list16(_pool), lambda _pool=_pool: _pool16_class(_pool),
                  size=len(POOLS16[_pool]))
register_pool("zoo-pretrained", _pretrained_pool, _hf_class)
register_backend("zoo", _agent_from_spec, _hf_class)

__all__ = ["NAMES", "NAMES3", "NAMES4", "POOLS", "POOL_SHAPES", "TASK", "TASK_OPTIONS", "TASKS3", "MODELS_DIR",
           "MODELS3_DIR", "MODELS4_DIR", "POOLS16", "load", "model_dir", "agents_list", "agents_list16"]
