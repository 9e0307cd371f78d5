"""Deterministic agents for tests and for analysis with known answers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agents.base import Agent, Generation, Message, Request, stable_hash, truncate_at_stop

Respond = Callable[[Any, list[Message]], str]


class ScriptedAgent(Agent):
    """An agent whose answer is ``respond(example, messages)``.

    ``example`` is the task example of the request (``request.metadata["example"]``, ``None`` if
    absent). Token counts are whitespace-token counts, so cost reports work on scripted pools too.

    Example:
        >>> from agents import ScriptedAgent
        >>> a = ScriptedAgent("const", lambda ex, msgs: "The answer is 4.")
        >>> a.generate([__import__("agents").Request([{"role": "user", "content": "2+2?"}])])[0].text
        'The answer is 4.'
    """

    def __init__(self, name: str, respond: Respond):
        if not callable(respond):
            raise TypeError(f"ScriptedAgent {name!r}: respond must be callable(example, messages) -> str")
        self.name = name
        self.respond = respond

    def _generate(self, requests: list[Request]) -> list[Generation]:
        out = []
        for r in requests:
            t0 = time.perf_counter()
            text = self._respond(r)
            if not isinstance(text, str):
                raise TypeError(f"ScriptedAgent {self.name!r}: respond returned {type(text).__name__}, expected str")
            text, _ = truncate_at_stop(text, r.sampling.stop)  # stop sequences, as every backend
            prompt_tokens = sum(len(m["content"].split()) for m in r.messages)
            out.append(
                Generation(
                    text=text,
                    finish_reason="stop",  # a scripted answer is complete (stopped or not)
                    prompt_tokens=prompt_tokens,
                    completion_tokens=len(text.split()),
                    seconds=time.perf_counter() - t0,
                )
            )
        return out

    def _respond(self, request: Request) -> str:
        return self.respond(request.metadata.get("example"), request.messages)

    @classmethod
    def expert(cls, name: str, accuracy: float, seed: int = 0) -> ScriptedAgent:
        """An agent right with probability ``accuracy``, decided per (seed, name, example, phase).

        A wrong answer is a deterministic wrong value (the reference plus 1..9 for numbers), so two
        wrong experts may or may not agree, as real models do.
        """
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy must be in [0, 1], got {accuracy}")

        return _Expert(name, accuracy, seed)

    @property
    def fingerprint(self) -> str:
        return getattr(self, "_fingerprint", f"ScriptedAgent:{self.name}:{getattr(self.respond, '__qualname__', '')}")


class _Expert(ScriptedAgent):
    def __init__(self, name: str, accuracy: float, seed: int):
        super().__init__(name, lambda example, messages: "")
        self.accuracy, self.seed = accuracy, seed
        self._fingerprint = f"expert:{name}:{accuracy}:{seed}"

    def _respond(self, request: Request) -> str:
        example = request.metadata.get("example")
        if example is None:
            raise ValueError(f"ScriptedAgent.expert {self.name!r} needs request.metadata['example']")
        h = stable_hash(self.seed, self.name, example.id, request.metadata.get("phase", 0))
        correct = (h % 1_000_000) / 1_000_000 < self.accuracy
        return f"The answer is {example.answer if correct else wrong_answer(example.answer, h)}."


def wrong_answer(reference: str, h: int) -> str:
    """A deterministic answer different from ``reference``."""
    try:
        value = float(reference)
    except ValueError:
        return f"{reference}-wrong{h % 7}"
    offset = 1 + (h >> 20) % 9
    value += offset
    return str(int(value)) if value == int(value) else f"{value:g}"
