"""Weight-level merges: several fine-tunes of one architecture become one model.

- :func:`soup`: the uniform soup, the element-wise mean of the members' state dicts (Wortsman et al. 2022).
- :func:`task_arithmetic`: ``base + scale * Σ_i (θ_i − base)``: the members' task vectors added to
  their common base (Ilharco et al. 2023). A member equal to the base adds a zero vector: nothing.
- :func:`ties`: TIES-merging (Yadav et al. 2023) of the task vectors: each trimmed to its ``density``
  largest-magnitude entries (per tensor), a sign elected per entry (the sign of the trimmed vectors'
  sum), the disjoint mean of the entries that agree with it, ``base + scale *`` that. A zero task vector
  votes for no sign and joins no mean: it adds nothing either.

:func:`merged_agent` builds the merged model as an :class:`~agents.HFAgent` (the first member's
tokenizer and settings), cached in memory by content: the key is the method, its parameters and the
members' (and base's) fingerprints, which hash every weight. Non-float tensors (buffers such as masks)
must be equal across members and are copied.

Example:
    >>> import agents
    >>> zoo = agents.pool("zoo")
    >>> a, b = zoo["model_0"], zoo["model_1"]
    >>> merged = merged_agent("soup", [a, b])
    >>> w = "transformer.h.0.mlp.c_fc.weight"
    >>> bool(torch.equal(merged.model.state_dict()[w], (a.model.state_dict()[w] + b.model.state_dict()[w]) / 2))
    True
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from agents.hf import HFAgent
from crl_kit.errors import ConfigError

METHODS = ("soup", "task_arithmetic", "ties")
#: config fields that name or describe a checkpoint without changing the network
_CONFIG_NOISE = {"_name_or_path", "name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype",
                 "_commit_hash", "_attn_implementation_autoset"}

State = Mapping[str, torch.Tensor]


def _is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point()


def soup(states: Sequence[State]) -> dict[str, torch.Tensor]:
    """The element-wise mean of ``states`` (float tensors; the others copied from the first)."""
    first = states[0]
    return {k: (torch.stack([s[k] for s in states]).mean(dim=0) if _is_float(v) else v.clone())
            for k, v in first.items()}


def task_vectors(base: State, states: Sequence[State]) -> list[dict[str, torch.Tensor]]:
    """``θ_i − base`` for every float tensor."""
    return [{k: s[k] - base[k] for k, v in base.items() if _is_float(v)} for s in states]


def task_arithmetic(base: State, states: Sequence[State], scale: float = 0.5) -> dict[str, torch.Tensor]:
    """``base + scale * Σ_i (θ_i − base)``."""
    vectors = task_vectors(base, states)
    return {k: (v + scale * torch.stack([t[k] for t in vectors]).sum(dim=0) if _is_float(v) else v.clone())
            for k, v in base.items()}


def trim(vector: torch.Tensor, density: float) -> torch.Tensor:
    """``vector`` with all but its ``ceil(density * size)`` largest-magnitude entries set to 0 (ties at the
    threshold kept)."""
    if density >= 1.0 or vector.numel() == 0:
        return vector.clone()
    keep = max(1, int(-(-density * vector.numel() // 1)))
    threshold = vector.abs().flatten().kthvalue(vector.numel() - keep + 1).values
    return torch.where(vector.abs() >= threshold, vector, torch.zeros_like(vector))


def ties(base: State, states: Sequence[State], density: float = 0.2, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """TIES-merging: trim each task vector to ``density``, elect a sign per entry, take the disjoint mean."""
    vectors = task_vectors(base, states)
    out = {}
    for k, v in base.items():
        if not _is_float(v):
            out[k] = v.clone()
            continue
        trimmed = torch.stack([trim(t[k], density) for t in vectors])
        elected = torch.sign(trimmed.sum(dim=0))
        agree = (torch.sign(trimmed) == elected) & (trimmed != 0)
        count = agree.sum(dim=0)
        merged = torch.where(agree, trimmed, torch.zeros_like(trimmed)).sum(dim=0) / count.clamp(min=1)
        out[k] = v + scale * merged
    return out


def check_mergeable(agents: Sequence[HFAgent], what: str = "a weight merge") -> None:
    """One ``ValueError`` line unless every agent is a transformers model of one architecture (the same
    config, up to names, and the same tensor names and shapes) and one vocabulary.

    Raises:
        ValueError: a member that is not an HFAgent, or two members of different architectures.
    """
    for a in agents:
        if not isinstance(a, HFAgent):
            raise ConfigError(f"{what} needs transformers models (HFAgent) whose weights it can read; {a.name!r} is a "
                              f"{type(a).__name__}")
    first = agents[0]
    shape = _architecture(first)
    for a in agents[1:]:
        other = _architecture(a)
        if other != shape:
            config_a, config_b = shape[0], other[0]
            differing = sorted(k for k in set(config_a) | set(config_b) if config_a.get(k) != config_b.get(k))
            detail = f"config fields {differing[:4]}" if differing else "tensor names or shapes"
            raise ConfigError(f"{what} needs one architecture: {first.name!r} and {a.name!r} differ in {detail}; "
                              "merge fine-tunes of one model")
        if a.tokenizer.get_vocab() != first.tokenizer.get_vocab():
            raise ConfigError(f"{what} needs one vocabulary: {first.name!r} and {a.name!r} have different tokenizers")


def _architecture(agent: HFAgent) -> tuple[dict, list]:
    config = {k: v for k, v in agent.model.config.to_dict().items() if k not in _CONFIG_NOISE}
    tensors = [(k, tuple(t.shape), str(t.dtype)) for k, t in agent.model.state_dict().items()]
    return config, tensors


def declared_base(agent: HFAgent) -> str | None:
    """The base model ``agent`` declares it was fine-tuned from (its ``training.json``, written by the zoo's
    builders next to the weights: ``spec.parent``, or ``"zoo-base"`` for the first zoo's ``from_base``), or
    ``None`` when it declares none."""
    source = getattr(agent.model.config, "_name_or_path", "") or ""
    path = Path(source) / "training.json"
    if not source or not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text()).get("spec", {})
    except (OSError, json.JSONDecodeError):
        return None
    if spec.get("parent"):
        return str(spec["parent"])
    return "zoo-base" if spec.get("from_base") else None


def check_common_base(members: Sequence[HFAgent], base: HFAgent, method: str) -> None:
    """One ``ValueError`` line unless ``base`` shares the members' architecture and the members that declare
    a base (:func:`declared_base`) all declare the same one.

    Raises:
        ValueError: different architectures, or members fine-tuned from different bases.
    """
    check_mergeable([base, *members], what=method)
    declared: dict[str, list[str]] = {}
    for m in members:
        name = declared_base(m)
        if name is not None:
            declared.setdefault(name, []).append(m.name)
    if len(declared) > 1:
        listing = "; ".join(f"{b}: {', '.join(ms)}" for b, ms in sorted(declared.items()))
        raise ConfigError(f"{method} needs members fine-tuned from one base, but they declare different bases "
                          f"({listing}); value a pool of one lineage")


#: merged models by content key (:func:`merge_key`), most recent last
_CACHE: OrderedDict[str, HFAgent] = OrderedDict()
CACHE_SIZE = 512


def merge_key(method: str, members: Sequence[HFAgent], base: HFAgent | None, params: Mapping[str, float]) -> str:
    """The content key of a merge: method, parameters, the members' fingerprints in order and the base's."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([method, sorted(params.items()), [m.fingerprint for m in members],
                         None if base is None else base.fingerprint]).encode())
    return h.hexdigest()


def merged_agent(method: str, members: Sequence[HFAgent], base: HFAgent | None = None, *,
                 name: str | None = None, **params: float) -> HFAgent:
    """The merge of ``members`` by ``method`` (``"soup"``, ``"task_arithmetic"`` with ``scale``, ``"ties"``
    with ``density`` and ``scale``) as an HFAgent, cached by content (:func:`merge_key`).

    Raises:
        ValueError: an unknown method, a missing or unwanted base, or members that cannot be merged
            (:func:`check_mergeable`, :func:`check_common_base`).
    """
    if method not in METHODS:
        raise ConfigError(f"unknown merge method {method!r}; choose one of {', '.join(METHODS)}")
    members = list(members)
    if not members:
        raise ConfigError("a merge needs at least one member")
    if method == "soup":
        if base is not None:
            raise ConfigError("a uniform soup takes no base; task_arithmetic and ties do")
        check_mergeable(members, what="a uniform soup")
    else:
        if base is None:
            raise ConfigError(f"{method} needs the members' common base: pass base=")
        check_common_base(members, base, method)
    key = merge_key(method, members, base, params)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    with torch.no_grad():
        states = [m.model.state_dict() for m in members]
        if method == "soup":
            merged = soup(states)
        elif method == "task_arithmetic":
            merged = task_arithmetic(base.model.state_dict(), states, **params)
        else:
            merged = ties(base.model.state_dict(), states, **params)
        template = (base or members[0])
        model = copy.deepcopy(template.model)
        model.load_state_dict(merged)
    lead = members[0]
    agent = HFAgent(model, tokenizer=lead.tokenizer, name=name or f"{method}({'+'.join(m.name for m in members)})",
                    device=lead.device, batch_size=lead.batch_size, num_threads=lead.num_threads)
    _CACHE[key] = agent
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return agent


__all__ = ["METHODS", "soup", "task_arithmetic", "ties", "trim", "task_vectors", "merged_agent", "merge_key",
           "check_mergeable", "check_common_base", "declared_base"]
