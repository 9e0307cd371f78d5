"""Loading benchmark rows with ``datasets``: from the hub by id, or from local files (``path=``)."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from crl_envs.tasks.base import Example
from crl_kit.errors import ConfigError

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
    """Rows of ``hub_id``/``config``/``split``, or of the local file(s) at ``path``.

    Local files may be JSON, JSON Lines, Parquet or CSV (gzip-compressed too); they must have the
    ``required`` fields, as the hub dataset does. A file gives every split all its rows, unless its rows
    carry a ``split`` field: then ``split`` reads the rows whose field names it (one file holding a train
    and a test split gives each its own, disjoint rows; a split with no row is refused).
    """
    import datasets
    from datasets.exceptions import DatasetGenerationError

    if path is not None:
        files = [os.fspath(p) for p in ([path] if isinstance(path, (str, os.PathLike)) else path)]
        expected = f"rows with fields {list(required)}"
        for f in files:
            if not os.path.exists(f):
                raise FileNotFoundError(f"{task}: no such file {f!r} (expected a file with fields {list(required)})")
            if not os.path.isfile(f):
                raise IsADirectoryError(f"{task}: {f!r} is a directory, not a data file; pass path= the file "
                                        f"itself (JSON/JSONL/Parquet/CSV {expected})")
            if os.path.getsize(f) == 0:
                raise ConfigError(f"{task}: the data file {f!r} is empty; it needs {expected}")
        ext = _extension(files[0])
        if ext not in _BUILDERS:
            raise ConfigError(f"{task}: cannot read {files[0]!r}; use one of {sorted(_BUILDERS)} (optionally .gz)")
        kwargs = {"delimiter": "\t"} if ext == ".tsv" else {}
        try:
            data = datasets.load_dataset(_BUILDERS[ext], data_files=files, split="train", **kwargs)
        except (DatasetGenerationError, ValueError, StopIteration) as e:
            cause = e.__cause__ if isinstance(e, DatasetGenerationError) and e.__cause__ is not None else e
            detail = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
            if "corresponds to no data" in detail:  # datasets' words for a file without rows
                detail = "no rows"
            raise ConfigError(f"{task}: cannot read {', '.join(map(repr, files))} as {ext[1:].upper()} ({detail}); "
                             f"fix the file: it needs {expected}") from None
        if len(data) == 0:
            raise ConfigError(f"{task}: cannot read {', '.join(map(repr, files))} as {ext[1:].upper()} (no rows); "
                             f"fix the file: it needs {expected}")
    else:
        data = load_hub_dataset(task, hub_id, config, split, required)
    missing = set(required) - set(data.column_names)
    if missing:
        raise ConfigError(f"{task} data lacks fields {sorted(missing)}; got {data.column_names}")
    rows = list(data)
    if path is not None and "split" in data.column_names:
        kept = [row for row in rows if row["split"] == split]
        if not kept:
            named = sorted({str(row["split"]) for row in rows})
            raise ConfigError(f"{task}: no row of {', '.join(map(repr, files))} has split {split!r} (its rows' split "
                              f"field holds {named}); ask for one of those splits or mark rows {split!r}")
        return kept
    return rows


def load_hub_dataset(task: str, hub_id: str, config: str | None, split: str, required: Sequence[str]):
    """``datasets.load_dataset(hub_id, config, split=split)``, failing in about a second, with the fix
    (``path=`` a local copy) named, when the hub is unreachable or ``HF_HUB_OFFLINE`` is set and the
    dataset is not cached."""
    import datasets

    from agents.hub import hub_offline, offline_miss, require_hub

    fix = (f"pass path= a local copy of {hub_id!r} (JSON/JSONL/Parquet/CSV with fields {list(required)}), "
           f"e.g. tasks.load({task!r}, path='test.jsonl') or on the command line --task-option path=test.jsonl")
    what = f"task {task!r} (hub dataset {hub_id!r})"
    require_hub(what, fix)
    try:
        return datasets.load_dataset(hub_id, config, split=split)
    except (ConnectionError, FileNotFoundError) as e:
        if hub_offline():
            raise offline_miss(what, fix, e) from e
        raise


def subsample(examples: list[Example], n: int | None, seed: int) -> list[Example]:
    """``n`` examples drawn with ``random.Random(seed)`` (all of them when ``n`` is ``None``)."""
    if n is None:
        return examples
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    return random.Random(seed).sample(examples, min(n, len(examples)))


def check_split(task: str, split: str, allowed: Sequence[str]) -> str:
    if split not in allowed:
        raise ConfigError(f"{task} has splits {list(allowed)}, got {split!r}")
    return split


def _extension(path: str) -> str:
    base = path[:-3] if path.endswith(".gz") else path
    return os.path.splitext(base)[1].lower()
