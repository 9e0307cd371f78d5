"""Deterministic agents for tests and for analysis with known answers."""

from __future__ import annotations

import functools
import time
import types
from collections.abc import Callable
from typing import Any

from agents.base import Agent, Generation, Message, Request, stable_hash, truncate_at_stop
from crl_kit.errors import ConfigError, ConfigTypeError

Respond = Callable[[Any, list[Message]], str]


class ScriptedAgent(Agent):
    """An agent whose answer is ``respond(example, messages)``.

    ``example`` is the task example of the request (``request.context.example``, ``None`` if
    absent). Token counts are whitespace-token counts, so cost reports work on scripted pools too.

    Example:
        >>> from agents import ScriptedAgent
        >>> a = ScriptedAgent("const", lambda ex, msgs: "The answer is 4.")
        >>> a.generate([__import__("agents").Request([{"role": "user", "content": "2+2?"}])])[0].text
        'The answer is 4.'
    """

    def __init__(self, name: str, respond: Respond):
        if not callable(respond):
            raise ConfigTypeError(f"ScriptedAgent {name!r}: respond must be callable(example, messages) -> str")
        self.name = name
        self.respond = respond

    def _generate(self, requests: list[Request]) -> list[Generation]:
        out = []
        for r in requests:
            t0 = time.perf_counter()
            text = self._respond(r)
            if not isinstance(text, str):
                raise ConfigTypeError(f"ScriptedAgent {self.name!r}: respond returned {type(text).__name__}, expected str")
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
        return self.respond(request.context.example, request.messages)

    @classmethod
    def expert(cls, name: str, accuracy: float, seed: int = 0) -> ScriptedAgent:
        """An agent right with probability ``accuracy``, decided per (seed, name, example, phase).

        A wrong answer is a deterministic wrong value (the reference plus 1..9 for numbers), so two
        wrong experts may or may not agree, as real models do.
        """
        if not 0.0 <= accuracy <= 1.0:
            raise ConfigError(f"accuracy must be in [0, 1], got {accuracy}")

        return _Expert(name, accuracy, seed)

    @property
    def fingerprint(self) -> str:
        """The name plus a digest of what decides the answers: ``respond``'s code, constants, defaults,
        closure values and the globals it reads, and the class's overridden methods. Two agents that
        answer differently never share a fingerprint (so never share cached results); the same
        definition gives the same fingerprint in every process."""
        if hasattr(self, "_fingerprint"):
            return self._fingerprint
        cls = type(self)
        _ACTIVE.add(id(self))
        try:
            parts = [cls.__module__, cls.__qualname__, _behaviour(self.respond)]
            parts += [_behaviour(getattr(cls, m)) for m in ("_respond", "_generate")
                      if getattr(cls, m) is not getattr(ScriptedAgent, m)]
        finally:
            _ACTIVE.discard(id(self))
        return f"ScriptedAgent:{self.name}:{getattr(self.respond, '__qualname__', '')}:{stable_hash(*parts):016x}"


class _Expert(ScriptedAgent):
    def __init__(self, name: str, accuracy: float, seed: int):
        super().__init__(name, lambda example, messages: "")
        self.accuracy, self.seed = accuracy, seed
        self._fingerprint = f"expert:{name}:{accuracy}:{seed}"

    def _respond(self, request: Request) -> str:
        example, phase = request.context.example, request.context.phase
        if example is None:
            raise ConfigError(f"ScriptedAgent.expert {self.name!r} needs the request's task example: "
                              f"Request(messages, context=RequestContext(example=...))")
        h = stable_hash(self.seed, self.name, example.id, 0 if phase is None else phase)
        correct = (h % 1_000_000) / 1_000_000 < self.accuracy
        return f"The answer is {example.answer if correct else wrong_answer(example.answer, h)}."


def _behaviour(obj: Any, depth: int = 0) -> Any:
    """A process-independent description of a callable's behaviour (for fingerprints): code objects
    by bytecode, constants and names; closures, defaults and read globals by value. Objects without a
    stable description fall back to their identity, which never collides (it only misses the cache)."""
    if depth > 6:
        return "..."
    if isinstance(obj, (str, bytes, int, float, complex, bool, type(None))):
        return obj
    if isinstance(obj, (tuple, list, frozenset, set)):
        items = [_behaviour(x, depth + 1) for x in obj]
        return (type(obj).__name__, sorted(items, key=repr) if isinstance(obj, (set, frozenset)) else items)
    if isinstance(obj, dict):
        return ("dict", sorted(((repr(k), _behaviour(v, depth + 1)) for k, v in obj.items()), key=lambda kv: kv[0]))
    if isinstance(obj, types.CodeType):
        return ("code", obj.co_code, _behaviour(obj.co_consts, depth + 1), obj.co_names)
    if isinstance(obj, types.MethodType):
        return ("method", _behaviour(obj.__func__, depth + 1), _behaviour(obj.__self__, depth + 1))
    if isinstance(obj, functools.partial):
        return ("partial", _behaviour(obj.func, depth + 1), _behaviour(obj.args, depth + 1),
                _behaviour(obj.keywords, depth + 1))
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        read = {n: obj.__globals__[n] for n in code.co_names if n in obj.__globals__}
        return ("function", obj.__module__, obj.__qualname__, _behaviour(code, depth + 1),
                _behaviour(obj.__defaults__, depth + 1), _behaviour(obj.__kwdefaults__, depth + 1),
                _behaviour([c.cell_contents for c in obj.__closure__ or () if _filled(c)], depth + 1),
                _behaviour({n: v for n, v in read.items() if not isinstance(v, types.ModuleType)}, depth + 1))
    if isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType)):
        return ("ref", getattr(obj, "__module__", None), getattr(obj, "__qualname__", getattr(obj, "__name__", "")))
    if isinstance(obj, Agent):
        if id(obj) in _ACTIVE:
            return ("agent", "self")
        _ACTIVE.add(id(obj))
        try:
            return ("agent", obj.fingerprint)
        finally:
            _ACTIVE.discard(id(obj))
    text = repr(obj)
    return ("object", type(obj).__qualname__, text if " at 0x" not in text else id(obj))


def _filled(cell: Any) -> bool:
    try:
        return cell.cell_contents is not _EMPTY
    except ValueError:  # an empty cell
        return False


_EMPTY = object()
_ACTIVE: set[int] = set()  # agents being fingerprinted (a respond bound to its own agent is a cycle)


def wrong_answer(reference: str, h: int) -> str:
    """A deterministic answer different from ``reference``."""
    try:
        value = float(reference)
    except ValueError:
        return f"{reference}-wrong{h % 7}"
    offset = 1 + (h >> 20) % 9
    value += offset
    return str(int(value)) if value == int(value) else f"{value:g}"
