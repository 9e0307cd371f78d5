"""Loading benchmark rows with ``datasets``: from the hub by id, or from local files (``path=``)."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from crl_envs.tasks.base import Example

_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".tsv": "csv"}


def load_rows(
    task: str,
    *,
    hub_id: str,
    config: str | None,
    split: str,
    path: str | os.PathLike | Sequence[str | os.PathLike] | None,
    required: Sequence[str],
) -> list[dict[str, Any]]:
    """Rows of ``hub_id``/``config``/``split``, or of the local file(s) at ``path`` (all rows).

    Local files may be JSON, JSON Lines, Parquet or CSV (gzip-compressed too); they must have the
    ``required`` fields, as the hub dataset does.
    """
    import datasets

    if path is not None:
        files = [os.fspath(p) for p in ([path] if isinstance(path, (str, os.PathLike)) else path)]
        for f in files:
            if not os.path.exists(f):
                raise FileNotFoundError(f"{task}: no such file {f!r} (expected a file with fields {list(required)})")
        ext = _extension(files[0])
        if ext not in _BUILDERS:
            raise ValueError(f"{task}: cannot read {files[0]!r}; use one of {sorted(_BUILDERS)} (optionally .gz)")
        kwargs = {"delimiter": "\t"} if ext == ".tsv" else {}
        data = datasets.load_dataset(_BUILDERS[ext], data_files=files, split="train", **kwargs)
    else:
        data = datasets.load_dataset(hub_id, config, split=split)
    missing = set(required) - set(data.column_names)
    if missing:
        raise ValueError(f"{task} data lacks fields {sorted(missing)}; got {data.column_names}")
    return list(data)


def subsample(examples: list[Example], n: int | None, seed: int) -> list[Example]:
    """``n`` examples drawn with ``random.Random(seed)`` (all of them when ``n`` is ``None``)."""
    if n is None:
        return examples
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return random.Random(seed).sample(examples, min(n, len(examples)))


def check_split(task: str, split: str, allowed: Sequence[str]) -> str:
    if split not in allowed:
        raise ValueError(f"{task} has splits {list(allowed)}, got {split!r}")
    return split


def _extension(path: str) -> str:
    base = path[:-3] if path.endswith(".gz") else path
    return os.path.splitext(base)[1].lower()
