"""What the zoo is, as data: its models, their training settings and the pools they form.

The runtime (:mod:`agents.zoo`) reads only this module; the builders (``python -m tools.zoo.build``)
read it too, and they alone import :mod:`crl_envs`. So importing :mod:`agents` never imports a builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------------- the arith zoo ("zoo", v1)
#: The task the zoo is trained for (pass these to ``crl_envs.tasks.load("arith", ...)``).
TASK_OPTIONS: dict[str, Any] = {"digits": 2, "operations": ("+", "-")}
#: ``--quick`` trains on one-digit questions (200 of them in all), which a model learns in a minute.
QUICK_TASK_OPTIONS: dict[str, Any] = {"digits": 1, "operations": ("+", "-")}


@dataclass(frozen=True)
class ModelSpec:
    """One zoo model: architecture, training length and its blind spot (a question kind)."""

    name: str
    blind: str | None
    description: str
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    steps: int = 1500
    from_base: bool = True
    blind_share: float = 0.03
    learning_rate: float = 2e-3
    answer_share: float = 0.6  # share of steps on answer-alone prompts; the rest on prompts with peers
    stubborn: bool = False  # asked to revise, it repeats its own previous answer
    confident: bool = False  # states confidence 9 even on its blind spot

    def blind_kinds(self) -> frozenset[str]:
        """The question kinds this model rarely saw: ``blind`` is one kind or several joined by ``+``
        (``"carry+borrow"``)."""
        return frozenset(self.blind.split("+")) if self.blind else frozenset()


BASE = ModelSpec("zoo-base", None, "shared base: format and carry-free core", steps=2000, from_base=False,
                 learning_rate=3e-3)
SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("zoo-nocarry", "carry", "rarely saw additions whose units carry"),
    ModelSpec("zoo-noborrow", "borrow", "rarely saw subtractions whose units borrow"),
    ModelSpec("zoo-small", "hundreds", "rarely saw sums of 100 or more"),
    ModelSpec("zoo-positive", "negative", "rarely saw negative results"),
    ModelSpec("zoo-rookie", None, "saw everything, but only briefly after the base", steps=300),
)
QUICK_SPEC = ModelSpec("zoo-quick", None, "quick test model (one-digit questions)", n_layer=2, n_head=2, steps=450,
                       from_base=False, learning_rate=5e-3, answer_share=1.0)

# ---------------------------------------------------------------------- the multi-task zoo (v3)
#: The eight procedural tasks every v3 model is trained on, with their settings (defaults but arith's).
TASKS3: dict[str, dict[str, Any]] = {
    "arith": dict(TASK_OPTIONS), "wordprob": {}, "compare": {}, "logic": {},
    "pyfunc": {}, "pytrace": {}, "law": {}, "sequence": {},
}


#: Each task's question kinds in blind-spot order: a model with ``blind=i`` rarely saw kind ``i`` of
#: every task (its blind spot there). The last kinds (arith's ``negative`` and ``core``, the fourth kind
#: of every other task) are nobody's blind spot. ``tests/test_zoo3.py`` checks these are the tasks' kinds.
BLIND_ORDER: dict[str, tuple[str, ...]] = {
    "arith": ("carry", "borrow", "hundreds", "negative", "core"),
    "wordprob": ("add", "sub", "mixed", "times"),
    "compare": ("largest", "smallest", "order"),
    "logic": ("flat", "not", "nested", "mod"),
    "pyfunc": ("linear", "mod", "clip", "parity"),
    "pytrace": ("assign", "loop", "sum", "branch"),
    "law": ("linear", "square", "doubling", "rate"),
    "sequence": ("arithmetic", "geometric", "fibonacci", "alternate"),
}


@dataclass(frozen=True)
class Model3Spec:
    """One multi-task zoo model.

    ``parent``: ``"zoo3-base"`` to fine-tune the shared base, a name in :data:`FIRST_PHASE3` to continue
    that first phase (the specialists), ``None`` to train from scratch.
    ``blind``: an index into each task's :data:`BLIND_ORDER`; that kind makes up only ``blind_share``
    of the model's questions of the task (its blind spot), as in the arith zoo. ``stubborn``: asked to
    revise, it repeats its previous answer; ``confident``: always states confidence 9 (the soloist
    that collaborates badly).
    """

    name: str
    description: str
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    steps: int = 800
    parent: str | None = "zoo3-base"
    blind: int | None = None
    blind_share: float = 0.03
    stubborn: bool = False
    confident: bool = False
    learning_rate: float = 1e-3
    answer_share: float = 0.5
    batch: int = 48
    seed_offset: int = 0
    tags: tuple[str, ...] = field(default_factory=tuple)

    def blind_kind(self, task: str) -> str | None:
        """The question kind of ``task`` this model rarely saw (``None``: no blind spot)."""
        return None if self.blind is None else BLIND_ORDER[task][self.blind]


FROM_SCRATCH_STEPS = 4500
BASE3 = Model3Spec("zoo3-base", "shared multi-task base: every task, every prompt kind", steps=FROM_SCRATCH_STEPS,
                   parent=None, learning_rate=3e-3, seed_offset=100)
_SPECIALIST = dict(steps=FROM_SCRATCH_STEPS, parent=None, learning_rate=3e-3)
#: The specialists' first phase: from scratch, each with its blind spot (built into ``OUT/_first/``,
#: not shipped). The shipped specialists continue from them (:data:`SPECIALIST_MORE_STEPS` more steps).
FIRST_PHASE3: tuple[Model3Spec, ...] = (
    Model3Spec("zoo3-spec-a", "rarely saw the first kind of each task (arith carry, wordprob add, compare largest, "
               "logic flat, pyfunc linear, pytrace assign, law linear, sequence arithmetic)", blind=0,
               seed_offset=1, **_SPECIALIST),
    Model3Spec("zoo3-spec-b", "rarely saw the second kind of each task (arith borrow, wordprob sub, compare smallest, "
               "logic not, pyfunc mod, pytrace loop, law square, sequence geometric)", blind=1, seed_offset=2,
               **_SPECIALIST),
    Model3Spec("zoo3-spec-c", "rarely saw the third kind of each task (arith hundreds, wordprob mixed, compare order, "
               "logic nested, pyfunc clip, pytrace sum, law doubling, sequence fibonacci)", blind=2, seed_offset=3,
               **_SPECIALIST),
)
SPECIALIST_MORE_STEPS = 2500
SPECS3: tuple[Model3Spec, ...] = (
    *(Model3Spec(first.name, first.description + f"; {FROM_SCRATCH_STEPS} steps from scratch, then "
                 f"{SPECIALIST_MORE_STEPS} more", blind=first.blind, parent=first.name, steps=SPECIALIST_MORE_STEPS,
                 seed_offset=first.seed_offset + 10) for first in FIRST_PHASE3),
    Model3Spec("zoo3-gen-a", "zoo3-base fine-tuned on every task (seed a)", seed_offset=4),
    Model3Spec("zoo3-gen-b", "zoo3-base fine-tuned on every task (seed b)", seed_offset=5),
    Model3Spec("zoo3-gen-c", "zoo3-base fine-tuned on every task (seed c)", seed_offset=6),
    Model3Spec("zoo3-soloist", "zoo3-base fine-tuned twice as long; repeats its own answer when asked to revise, "
               "always says confidence 9", steps=1600, stubborn=True, confident=True, seed_offset=7),
    Model3Spec("zoo3-s", "small: 2 layers, width 32, from scratch", n_layer=2, n_embd=32, n_head=2,
               steps=FROM_SCRATCH_STEPS, parent=None, learning_rate=5e-3, seed_offset=8),
    Model3Spec("zoo3-m", "medium: 3 layers, width 48, from scratch", n_layer=3, n_embd=48, n_head=4,
               steps=FROM_SCRATCH_STEPS, parent=None, learning_rate=4e-3, seed_offset=9),
)
#: The v3 pools, ``agents.pool("zoo-<name>")``: model names in pool order. ``zoo-pretrained`` is the
#: real pretrained pool (``agents.pool("pretrained")``) under the zoo's naming.
POOLS3: dict[str, tuple[str, ...]] = {
    "zoo-specialists": ("zoo3-spec-a", "zoo3-spec-b", "zoo3-spec-c"),
    "zoo-generalists": ("zoo3-gen-a", "zoo3-gen-b", "zoo3-gen-c"),
    "zoo-scale": ("zoo3-s", "zoo3-m", "zoo3-gen-a"),
    "zoo-soloist": ("zoo3-soloist", "zoo3-gen-b", "zoo3-gen-c"),
}
POOL_SHAPES: dict[str, str] = {
    "zoo-specialists": "three models, each blind to a different question kind of every task: complementary blind "
                       "spots (as the arith zoo)",
    "zoo-generalists": "three fine-tunes of one base on the same mix, different seeds: correlated errors",
    "zoo-scale": "three sizes: 49k, 121k and 248k parameters",
    "zoo-soloist": "the strongest model alone, stubborn and over-confident inside protocols, with two generalists",
    "zoo-pretrained": "SmolLM2-135M-Instruct and gemma-3-270m (real pretrained LMs from PyPI)",
}
NAMES3: tuple[str, ...] = tuple(s.name for s in SPECS3)

# ---------------------------------------------------------------------- the arith zoo v4 (pools of 8)
#: Zoo v4 is trained for arith alone (:data:`TASK_OPTIONS`: the one task these 0.2M-parameter models
#: demonstrably learn; v1's specialists reach 0.65-0.73, blind baseline 0.003). The v3 zoo's other seven
#: tasks are left out of v4's pools, not averaged in: its models stay at the floor on wordprob, sequence
#: and pytrace and at 0.05 on arith.
TASKS4_LEFT_OUT: tuple[str, ...] = ("wordprob", "compare", "logic", "pyfunc", "pytrace", "law", "sequence")


@dataclass(frozen=True)
class Model4Spec(ModelSpec):
    """One v4 model: a :class:`ModelSpec` that continues ``parent``'s weights (``None``: from scratch),
    saved also at each of ``checkpoints`` (steps; each checkpoint is its own model,
    ``<name>-<steps>``), trained from the build's seed plus ``seed_offset``."""

    parent: str | None = "zoo4-base"
    checkpoints: tuple[int, ...] = ()
    seed_offset: int = 0
    from_base: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "from_base", self.parent is not None)

    def outputs(self) -> tuple[str, ...]:
        """The model names this run produces: its checkpoints', or its own."""
        return tuple(f"{self.name}-{c}" for c in self.checkpoints) or (self.name,)


BASE4 = Model4Spec("zoo4-base", None, "shared base: format and carry-free core (as v1's base)", steps=2000,
                   parent=None, learning_rate=3e-3, seed_offset=100)
_SINGLES = ("carry", "borrow", "hundreds", "negative")
#: Each kind is blind in one single and in two pairs; a pair's two kinds together are 3% of its mix.
_PAIRS = ("carry+borrow", "hundreds+negative", "carry+negative", "borrow+hundreds")
SPECIALIST4_STEPS = 1000
_ROOKIE_STEPS = (100, 200, 300, 400)
SPECS4: tuple[Model4Spec, ...] = (
    *(Model4Spec(f"zoo4-no{b.replace('+', '-')}", b, f"zoo4-base, then {SPECIALIST4_STEPS} steps on the full task "
                 f"but rarely {b.replace('+', ' or ')}", steps=SPECIALIST4_STEPS, seed_offset=1 + k)
      for k, b in enumerate(_SINGLES + _PAIRS)),
    # First built from scratch (3000 steps, lr 3e-3): validation accuracy 0.095 after 3000 steps, 0.145 after a second
    # 3000-step attempt: unlearned; so the ladder climbs from the base (a build observation, before any
    # pool was measured).
    Model4Spec("zoo4-ladder", None, "zoo4-base, then one run on the full task, saved at 8 step counts", steps=2000,
               checkpoints=(50, 100, 200, 300, 500, 800, 1200, 2000), seed_offset=20),
    Model4Spec("zoo4-strong", None, "zoo4-base, then 1500 steps on the full task, no blind spot", steps=1500,
               seed_offset=30),
    *(Model4Spec(f"zoo4-clone-{k}", None, "zoo4-strong fine-tuned 150 more steps at a low rate (its own seed)",
                 steps=150, parent="zoo4-strong", learning_rate=5e-4, seed_offset=31 + k) for k in range(1, 7)),
    Model4Spec("zoo4-soloist", None, "zoo4-base, then 2000 steps on the full task; asked to revise, repeats its own "
               "previous answer; always says confidence 9", steps=2000, stubborn=True, confident=True,
               seed_offset=40),
    *(Model4Spec(f"zoo4-rookie-{steps}{seed}", None, f"zoo4-base, then only {steps} steps on the full task "
                 f"(seed {seed})", steps=steps, seed_offset=50 + 2 * k + i)
      for k, steps in enumerate(_ROOKIE_STEPS) for i, seed in enumerate("ab")),
)
#: Every v4 model name a pool can hold (a ladder's checkpoints, not the ladder run itself).
NAMES4: tuple[str, ...] = tuple(n for s in SPECS4 for n in s.outputs())
#: The v4 pools, ``agents.pool("zoo4-<shape>")``: model names in pool order. Pools share members.
POOLS4: dict[str, tuple[str, ...]] = {
    "zoo4-specialists": tuple(s.name for s in SPECS4[:8]),
    "zoo4-ladder": SPECS4[8].outputs(),
    "zoo4-clones": ("zoo4-strong", *(f"zoo4-clone-{k}" for k in range(1, 7)), "zoo4-rookie-100a"),
    "zoo4-soloist": ("zoo4-soloist", "zoo4-nocarry", "zoo4-noborrow", "zoo4-nohundreds", "zoo4-nonegative",
                     "zoo4-rookie-400a", "zoo4-rookie-300a", "zoo4-rookie-200a"),
    "zoo4-rookies": tuple(f"zoo4-rookie-{steps}{seed}" for steps in _ROOKIE_STEPS for seed in "ab"),
}
#: Each v4 pool's shape and the effect it is meant to have, written before any v4 model was trained.
POOL_SHAPES4: dict[str, tuple[str, str]] = {
    "zoo4-specialists": (
        "complementary specialists: eight fine-tunes of one base, each blind to one arith kind (carry, borrow, "
        "hundreds, negative) or to a pair of them, every kind blind in one single and two pairs",
        "individual accuracy graded by severity (singles about 0.6, pairs lower), errors concentrated on different "
        "kinds so pairwise error correlation is low, at least one right far above the best single, vote above the "
        "best single, and each member's value to vote larger than its standalone rank suggests for the pairs"),
    "zoo4-ladder": (
        "a training ladder: one run from the base saved at 50, 100, 200, ..., 2000 steps",
        "accuracy rising with steps from the base's level, nested competence (a later rung is right where an "
        "earlier one is), so high error correlation, vote near the top rungs, and values that follow the rung order"),
    "zoo4-clones": (
        "redundant near-clones: a strong model and six short low-rate fine-tunes of it with their own seeds, plus "
        "one rookie as a clearly weaker outsider",
        "high individual accuracy but near-identical errors among the seven (error correlation near 1), so vote "
        "equals the best single, a clone's marginal (leave-one-out) value is about 0 though it is strong alone; the "
        "rookie separates the pool's best from its worst"),
    "zoo4-soloist": (
        "a stubborn, over-confident soloist (the longest-trained model; asked to revise, it repeats its own answer; "
        "always confidence 9) with the four single-blind specialists and three rookies",
        "the soloist is the best member alone, but debate does not move it and cascade trusts it everywhere; its "
        "value under debate falls short of what its standalone accuracy predicts, while the specialists' rises"),
    "zoo4-rookies": (
        "under-trained rookies: eight short runs from the base, 100 to 400 steps, two seeds each",
        "low, graded accuracy with room to improve: C-RL training should raise them more than it raises a fully "
        "trained pool; runs of the same length but different seeds differ less than runs of different lengths"),
}

# ---------------------------------------------------------------------- pools of 16 (zoo16: unions of v4)
@dataclass(frozen=True)
class Member16:
    """One seat of a pool of 16: a shipped v4 model, greedy (``temperature`` 0) or sampled at ``temperature``
    with the request's own seed (the runner derives it from the seat, so copies of one model draw apart)."""

    model: str
    temperature: float = 0.0

    @property
    def label(self) -> str:
        """The seat's display name: the model's, with ``@t<temperature>`` when it samples."""
        return self.model if self.temperature == 0 else f"{self.model}@t{self.temperature:g}"


#: The temperature of every sampled seat (top-p 1): chosen before any pool of 16 was played.
SAMPLED_TEMPERATURE = 0.7
_SAMPLED = SAMPLED_TEMPERATURE
#: The pools of 16, ``agents.pool("zoo16-<shape>")``: seats in pool order (zoo v4's models, no new training).
POOLS16: dict[str, tuple[Member16, ...]] = {
    "zoo16-graded": tuple(Member16(m) for m in (*POOLS4["zoo4-ladder"], *POOLS4["zoo4-rookies"])),
    "zoo16-copies": tuple(Member16("zoo4-strong", _SAMPLED) for _ in range(16)),
    "zoo16-specialists": (*(Member16(m) for m in POOLS4["zoo4-specialists"]),
                          *(Member16(m, _SAMPLED) for m in POOLS4["zoo4-specialists"])),
    "zoo16-tau0": tuple(Member16(m) for m in (*POOLS4["zoo4-clones"][:7], "zoo4-soloist", *POOLS4["zoo4-specialists"])),
}

#: Each pool of 16's shape, the effect it is meant to have (the checks ``benchmarks/pools16.py`` runs, quoted),
#: and the spacing of :data:`crl_envs.stats.PLANTED_POOLS` its power is stated for; written before the pool was
#: played (``zoo16-tau0``'s construction used other questions: see its entry).
POOL_SHAPES16: dict[str, tuple[str, str, str]] = {
    "zoo16-graded": (
        "a graded pool: zoo4-ladder's eight checkpoints (50 .. 2000 steps) and zoo4-rookies' eight short runs (100 .. "
        "400 steps, two seeds), every seat greedy",
        "solo accuracies span at least 0.5 (v4's report: 0.05 .. 0.86); nested competence, so vote value follows "
        "strength alone: the cross-fit verdict is coupled",
        "graded"),
    "zoo16-copies": (
        "a pool of copies: zoo4-strong sixteen times, every seat sampling at temperature 0.7 (top-p 1) with its "
        "own seed, so only chance separates the seats",
        "exchangeable seats: Cochran's Q does not reject one accuracy for all sixteen (p > 0.05), the population "
        "tau is undefined (every seat the same in distribution), so the cross-fit verdict is not coupled (at most "
        "alpha of the time)",
        "close"),
    "zoo16-specialists": (
        "complementary specialists: zoo4-specialists' eight models greedy, then the same eight sampled at "
        "temperature 0.7 (each blind to one arith kind or a pair; every kind blind in six of the sixteen seats)",
        "errors on different kinds: vote above the best seat alone, at least one seat right on 0.2 more questions "
        "than the best seat, and a specialist's greedy and sampled seats' errors correlating more than different "
        "specialists'; no verdict predicted (close spacing: the design has little power there)",
        "close"),
    "zoo16-tau0": (
        "built for a true tau near 0: eight individually strong, mutually redundant seats (zoo4-strong, its six "
        "near-clones, the soloist: v4 report 0.78 .. 0.85, right on the same questions) and eight individually "
        "weaker complementary ones (zoo4-specialists, 0.43 .. 0.63, blind to different kinds), every seat greedy; "
        "in vote the redundant seats split each question's credit many ways and a specialist is credited where "
        "the others fail. On planted truth with true niche solvers the construction gives tau about 0 "
        "(benchmarks/pools16.py, planted 'tau0'). Before it was played on the evaluation's questions, exact vote "
        "Shapley on 200 other arith test questions (seed 1, none shared) gave tau +0.91: v4's specialists are not "
        "niche solvers (the redundant seats are right on 80% of questions, the specialists' kinds included), so "
        "this real instance is expected to miss its shape; seventeen other unions tried there (identical copies of "
        "one model, sampled seats at temperature 1.5, mixes, pool orders) gave +0.78 .. +1.00",
        "the cross-fit tau lies in (-0.3, 0.3) and the verdict is not coupled (expected to fail on v4's models, "
        "see the shape)",
        "graded"),
}

__all__ = ["TASK_OPTIONS", "QUICK_TASK_OPTIONS", "ModelSpec", "BASE", "SPECS", "QUICK_SPEC", "TASKS3", "Model3Spec",
           "BASE3", "SPECS3", "POOLS3", "POOL_SHAPES", "NAMES3", "BLIND_ORDER", "FROM_SCRATCH_STEPS", "FIRST_PHASE3",
           "SPECIALIST_MORE_STEPS", "Model4Spec", "BASE4", "SPECS4", "NAMES4", "POOLS4", "POOL_SHAPES4",
           "TASKS4_LEFT_OUT", "SPECIALIST4_STEPS", "Member16", "SAMPLED_TEMPERATURE", "POOLS16",
           "POOL_SHAPES16"]
