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

__all__ = ["TASK_OPTIONS", "QUICK_TASK_OPTIONS", "ModelSpec", "BASE", "SPECS", "QUICK_SPEC", "TASKS3", "Model3Spec",
           "BASE3", "SPECS3", "POOLS3", "POOL_SHAPES", "NAMES3", "BLIND_ORDER", "FROM_SCRATCH_STEPS", "FIRST_PHASE3",
           "SPECIALIST_MORE_STEPS"]
