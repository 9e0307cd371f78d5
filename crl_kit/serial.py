"""Plain data for files and keys: :func:`digest` (what every cache and cell is keyed by) and :func:`jsonable`
(what every result file, checkpoint setup and tracker config is written as). One definition each, imported by
the valuation cache, the study, the trainers and the trackers."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import PurePath
from typing import Any

__all__ = ["digest", "jsonable"]


def digest(obj: Any) -> str:
    """A 32-hex-digit sha256 of ``obj``'s canonical JSON (keys sorted; objects JSON cannot hold by ``repr``).

    >>> digest({"b": 1, "a": [1, 2]}) == digest({"a": [1, 2], "b": 1})
    True
    """
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: mappings with ``str`` keys, tuples and lists as lists, numpy arrays as
    lists and numpy scalars as Python numbers (as numpy gives them: a numpy NaN stays NaN), a Python
    ``float('nan')`` as ``None``, paths and any other
    object JSON cannot hold as its ``str``.

    >>> import numpy as np
    >>> jsonable({1: (np.float64(0.5), float("nan")), "p": np.arange(2)})
    {'1': [0.5, None], 'p': [0, 1]}
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars (np.float64 is a float: first), torch tensors
    if callable(tolist) and type(value).__module__.split(".")[0] in ("numpy", "torch"):
        return tolist()
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    return str(value)
