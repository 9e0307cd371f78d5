"""The protocol roster: one versioned table that every list of protocols is derived from.

:data:`VERSIONS` maps a protocol's short name to its current version. From it come the facade's
factories (``crl_envs.<name>_v<version>``), the PettingZoo registration (``crl_envs/<name>-v<version>``),
:data:`crl_envs.protocols.PROTOCOLS` and each env's ``metadata["name"]``. The env lives in the module
``crl_envs.protocols.<name>`` as its ``env`` factory. This module imports nothing, so ``import crl_envs``
knows the roster without importing a protocol (or torch).

Bumping a protocol's version (a change of behaviour that makes old results incomparable) makes its
older names deprecated, as PettingZoo's ``DeprecatedModule`` does: ``crl_envs.debate_v0`` warns with
a ``DeprecationWarning`` and calling it raises PettingZoo's ``DeprecatedEnv`` (``"debate_v0 is now
deprecated, use debate_v1 instead"``); the code of the old version is not kept.

Example:
    >>> versioned("debate")
    'debate_v0'
    >>> parse("vote_v0"), parse("vote"), parse("nothing_v0")
    (('vote', 0), None, None)
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

#: Protocol short name -> current version, in the order protocols are listed everywhere.
VERSIONS: dict[str, int] = {
    "debate": 0,
    "vote": 0,
    "moa": 0,
    "routing": 0,
    "cascade": 0,
    "feedback": 0,
    "topology": 0,
    "blender": 0,
    "knowledge": 0,
    "judge": 0,
    "relay": 0,
    "refine": 0,
}

#: The logit- and weight-level protocols (:mod:`crl_envs.protocols.levels`), same naming and versioning.
#: They read the members' logits or weights, so they play transformers models (HFAgent) only: listed
#: apart from :data:`VERSIONS`, every one of whose protocols plays any pool (the suite's scripted pools too).
MODEL_LEVEL: dict[str, int] = {
    "logit_fusion": 0,
    "logit_contrast": 0,
    "soup": 0,
    "task_arithmetic": 0,
    "ties": 0,
}

_VERSIONED = re.compile(r"([a-z_]+?)_v(\d+)")


def versioned(name: str) -> str:
    """``"<name>_v<current version>"``: the facade's attribute and the env's ``metadata["name"]``.

    Raises:
        KeyError: ``name`` is not in :data:`VERSIONS`.
    """
    return f"{name}_v{VERSIONS[name] if name in VERSIONS else MODEL_LEVEL[name]}"


def module(name: str) -> str:
    """The module that defines protocol ``name``'s ``env`` factory."""
    return f"crl_envs.protocols.{name}"


def parse(name: str) -> tuple[str, int] | None:
    """``(short name, version)`` of a versioned protocol name (``"debate_v0"``), any version of a protocol
    in :data:`VERSIONS`; ``None`` for anything else."""
    match = _VERSIONED.fullmatch(name)
    if match is None or match.group(1) not in VERSIONS:
        return None
    return match.group(1), int(match.group(2))


def deprecated(name: str, version: int) -> Callable[..., Any]:
    """The stand-in for ``<name>_v<version>`` older than the current version: PettingZoo's
    ``DeprecatedModule(...).env``, whose call raises ``DeprecatedEnv`` naming the current version. Getting
    it warns (``DeprecationWarning``), so an import of the old name is flagged before it is called."""
    from pettingzoo.utils.deprecated_module import DeprecatedModule

    current = VERSIONS[name]
    warnings.warn(f"{name}_v{version} is now deprecated, use {name}_v{current} instead", DeprecationWarning,
                  stacklevel=3)
    return DeprecatedModule(name, version, current).env


def model_level(name: str) -> str | None:
    """The short name of a logit- or weight-level protocol (:data:`MODEL_LEVEL`) given as ``"logit_fusion"``,
    ``"logit-fusion"`` or ``"logit_fusion_v0"`` (its current version), else ``None``.

    Example:
        >>> model_level("logit-fusion"), model_level("soup_v0"), model_level("vote")
        ('logit_fusion', 'soup', None)
    """
    key = name.replace("-", "_")
    if key in MODEL_LEVEL:
        return key
    match = _VERSIONED.fullmatch(key)
    if match and match.group(1) in MODEL_LEVEL and int(match.group(2)) == MODEL_LEVEL[match.group(1)]:
        return match.group(1)
    return None


__all__ = ["MODEL_LEVEL", "model_level", "VERSIONS", "versioned", "module", "parse", "deprecated"]
