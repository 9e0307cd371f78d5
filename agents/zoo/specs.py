"""What the zoo is, as data: its models, their training settings and the pools they form.

The runtime (:mod:`agents.zoo`) reads only this module; the builders (``python -m agents.zoo.build``)
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
REASONING, CODING, DISCOVERY = ("arith", "wordprob", "compare", "logic"), ("pyfunc", "pytrace"), ("law", "sequence")


@dataclass(frozen=True)
class Model3Spec:
    """One multi-task zoo model.

    ``parent``: ``"zoo3-base"`` to fine-tune the shared base, ``None`` to train from scratch.
    ``focus``: the tasks that make up ``focus_share`` of its steps (``()``: all tasks alike).
    ``stubborn``: asked to revise, it repeats its previous answer; ``confident``: always states
    confidence 9 (the soloist that collaborates badly).
    """

    name: str
    description: str
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    steps: int = 150
    parent: str | None = "zoo3-base"
    focus: tuple[str, ...] = ()
    focus_share: float = 0.85
    stubborn: bool = False
    confident: bool = False
    learning_rate: float = 1e-3
    answer_share: float = 0.5
    batch: int = 48
    seed_offset: int = 0
    tags: tuple[str, ...] = field(default_factory=tuple)


BASE3 = Model3Spec("zoo3-base", "shared multi-task base: every task, every prompt kind", steps=1200, parent=None,
                   learning_rate=3e-3, seed_offset=100)
SPECS3: tuple[Model3Spec, ...] = (
    Model3Spec("zoo3-reasoner", "fine-tuned on the reasoning tasks", focus=REASONING, seed_offset=1),
    Model3Spec("zoo3-coder", "fine-tuned on the coding tasks", focus=CODING, seed_offset=2),
    Model3Spec("zoo3-scientist", "fine-tuned on the discovery tasks", focus=DISCOVERY, seed_offset=3),
    Model3Spec("zoo3-gen-a", "fine-tuned on every task (seed a)", seed_offset=4),
    Model3Spec("zoo3-gen-b", "fine-tuned on every task (seed b)", seed_offset=5),
    Model3Spec("zoo3-gen-c", "fine-tuned on every task (seed c)", seed_offset=6),
    Model3Spec("zoo3-soloist", "fine-tuned twice as long; repeats its own answer when asked to revise, "
               "always says confidence 9", steps=300, stubborn=True, confident=True, seed_offset=7),
    Model3Spec("zoo3-s", "small: 2 layers, width 32, from scratch", n_layer=2, n_embd=32, n_head=2, steps=1200,
               parent=None, learning_rate=5e-3, seed_offset=8),
    Model3Spec("zoo3-m", "medium: 3 layers, width 48, from scratch", n_layer=3, n_embd=48, n_head=4, steps=1200,
               parent=None, learning_rate=4e-3, seed_offset=9),
)
#: The v3 pools, ``agents.pool("zoo-<name>")``: model names in pool order. ``zoo-pretrained`` is the
#: real pretrained pool (``agents.pool("pretrained")``) under the zoo's naming.
POOLS3: dict[str, tuple[str, ...]] = {
    "zoo-specialists": ("zoo3-reasoner", "zoo3-coder", "zoo3-scientist"),
    "zoo-generalists": ("zoo3-gen-a", "zoo3-gen-b", "zoo3-gen-c"),
    "zoo-scale": ("zoo3-s", "zoo3-m", "zoo3-gen-a"),
    "zoo-soloist": ("zoo3-soloist", "zoo3-gen-b", "zoo3-gen-c"),
}
POOL_SHAPES: dict[str, str] = {
    "zoo-specialists": "each fine-tuned on one kind of task (reasoning, coding, discovery): complementary strengths",
    "zoo-generalists": "three fine-tunes of one base on the same mix, different seeds: correlated errors",
    "zoo-scale": "three sizes: 49k, 121k and 248k parameters",
    "zoo-soloist": "the strongest model alone, stubborn and over-confident inside protocols, with two generalists",
    "zoo-pretrained": "SmolLM2-135M-Instruct and gemma-3-270m (real pretrained LMs from PyPI)",
}
NAMES3: tuple[str, ...] = tuple(s.name for s in SPECS3)

__all__ = ["TASK_OPTIONS", "QUICK_TASK_OPTIONS", "ModelSpec", "BASE", "SPECS", "QUICK_SPEC", "TASKS3", "Model3Spec",
           "BASE3", "SPECS3", "POOLS3", "POOL_SHAPES", "NAMES3", "REASONING", "CODING", "DISCOVERY"]
