"""A training run's files in ``config.output_dir``: checkpoints that resume after a kill (written atomically,
every file checked before anything is loaded, refused when written with other settings), the metrics log
kept in step with the checkpoint resumed from, a fresh start (``fit(resume=False)``) and the trained model.

Functions of the run's :class:`trainers.state.TrainerState` (step, rollouts, history: what they read and write)
and its learners' :class:`trainers.learners.LearnerState` (weights and optimizers); the trainer keeps its methods
of the same names (``save_checkpoint``, ``load_checkpoint``, ...) as one-line calls of these and reads nothing
else of them. Layout of a checkpoint::

    output_dir/checkpoint-000002/state.json      step, rollouts, config, trainer, learner(s), setup
                                 rng.pt          torch's RNG state
                                 trainable.pt    one learner: its trainable tensors (the adapter with LoRA)
                                 optimizer.pt    one learner: its optimizer state
                                 <id>/...        several learners: each one's two files in its own folder
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agents import stable_hash
from crl_kit.errors import ConfigError, RunError
from crl_kit.safe_io import atomic_write_text, read_json, read_regular
from crl_kit.serial import jsonable

if TYPE_CHECKING:  # pragma: no cover
    from trainers.config import TrainerConfig
    from trainers.learners import LearnerState
    from trainers.state import TrainerState

#: Config fields that do not change what training computes: a checkpoint written under other values resumes.
RESUMABLE_FIELDS = frozenset({"steps", "output_dir", "save_steps", "tensorboard", "trackers", "tracking_project",
                              "tracking_dir", "progress"})


def learner_key(learners: list[str]) -> str | list[str]:
    """The learner(s) as checkpoints record them: the id for one, the list for several."""
    return learners[0] if len(learners) == 1 else list(learners)


def learner_dir(root: Path, learners: list[str], learner: str) -> Path:
    """Where ``learner``'s files go inside a checkpoint: the checkpoint itself for one learner, else ``<id>/``."""
    return root if len(learners) == 1 else root / learner


def list_checkpoints(output_dir: str | None) -> list[Path]:
    """The checkpoint directories in ``output_dir`` (those with a ``state.json``), oldest first."""
    if not output_dir or not Path(output_dir).is_dir():
        return []
    return sorted(p for p in Path(output_dir).glob("checkpoint-*") if (p / "state.json").exists())


def setup_of(trainer: Any) -> dict[str, Any]:
    """What, besides the config, a checkpoint must share with ``trainer`` to resume it."""
    return {"trainer": type(trainer).__name__, "learner": learner_key(trainer.learners),
            "protocol": getattr(trainer.protocol, "__name__", str(trainer.protocol)),
            "task": {"name": trainer.task.name, "n": len(trainer.task),
                     "ids": stable_hash(*[ex.id for ex in trainer.task]) % (2**61)},
            "pool": [trainer.pool[a].name for a in trainer.pool.ids],
            "bases": [trainer.bases[a] for a in trainer.pool.ids]}


def save_checkpoint(output_dir: str | None, state: TrainerState, learners: Mapping[str, LearnerState],
                    record: Mapping[str, Any]) -> Path:
    """Write ``output_dir/checkpoint-<step>`` atomically (a temporary directory renamed into place): each learner's
    trainable tensors and optimizer, torch's RNG state, and ``state.json`` with ``state``'s :meth:`~trainers.state.
    TrainerState.to_dict` and ``record`` (config, trainer, learner(s), setup: what a resume is checked against)."""
    if not output_dir:
        raise ConfigError("save_checkpoint needs config.output_dir")
    root = Path(output_dir)
    final = root / f"checkpoint-{state.step:06d}"
    tmp = root / f".tmp-checkpoint-{state.step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for j, learner_state in learners.items():
        where = learner_dir(tmp, list(learners), j)
        where.mkdir(exist_ok=True)
        torch.save(learner_state.trainable_state(), where / "trainable.pt")
        torch.save(learner_state.optimizer.state_dict(), where / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({**state.to_dict(), **record}, indent=1, default=str))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def checkpoint_differences(saved: dict[str, Any], config: TrainerConfig, setup: dict[str, Any]) -> list[str]:
    """``field: saved -> current`` for every setting where a checkpoint's ``state.json`` (``saved``) differs from
    the run's ``config`` and ``setup`` (:func:`setup_of`)."""
    defaults = jsonable(type(config)().to_dict())
    saved_cfg = {**{k: v for k, v in defaults.items() if k not in saved.get("config", {})},  # fields added since
                 **saved.get("config", {})}
    saved_cfg = {k: v for k, v in saved_cfg.items() if k not in RESUMABLE_FIELDS}
    current_cfg = {k: v for k, v in jsonable(config.to_dict()).items() if k not in RESUMABLE_FIELDS}
    before = {**{f"config.{k}": v for k, v in saved_cfg.items()}, **saved.get("setup", {})}
    current = {**{f"config.{k}": v for k, v in current_cfg.items()},
               **{k: v for k, v in jsonable(setup).items() if k in saved.get("setup", {})}}
    if "setup" not in saved:  # written before setups were stored: the trainer and learner were
        before.update(trainer=saved.get("trainer"), learner=saved.get("learner"))
        current.update(trainer=setup["trainer"], learner=setup["learner"])
    return [f"{k}: {before.get(k, '<unset>')!r} -> {current.get(k, '<unset>')!r}"
            for k in sorted(set(before) | set(current)) if before.get(k) != current.get(k)]


def checkpoint_problem(path: Path, learners: Sequence[str]) -> str:
    """What is wrong with the checkpoint directory ``path`` of a run training ``learners`` ("" when every file
    it needs is there and reads back), checked before anything is loaded: state.json, rng.pt, and each learner's
    trainable.pt and optimizer.pt (torch archives whose zip index must read)."""
    import zipfile

    try:
        state = read_json(path / "state.json")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"{path / 'state.json'} is unreadable ({type(e).__name__})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) \
            or not isinstance(state.get("rollouts"), int):
        return f"{path / 'state.json'} holds no step and rollouts"
    files = [path / "rng.pt"] + [learner_dir(path, list(learners), j) / name for j in learners
                                 for name in ("trainable.pt", "optimizer.pt")]
    for f in files:
        if not f.is_file() or f.is_symlink():
            return f"{f} is missing"
        try:
            with zipfile.ZipFile(f) as archive:
                bad = archive.testzip()
        except (OSError, zipfile.BadZipFile) as e:
            return f"{f} is damaged ({type(e).__name__}: {e})"
        if bad is not None:
            return f"{f} is damaged (its member {bad} fails its checksum)"
    return ""


def checkpoint_to_load(output_dir: str | None, learners: Sequence[str], path: str | Path | None, *,
                       name: str) -> Path | None:
    """``path`` checked (a damaged one raises), or the latest undamaged checkpoint in ``output_dir`` (each damaged
    one skipped is reported in one line, prefixed with ``name``), or None."""
    if path is not None:
        path = Path(path)
        problem = checkpoint_problem(path, learners)
        if problem:
            raise RunError(f"cannot resume from {path}: {problem}; pass another checkpoint or fit(resume=False)")
        return path
    for candidate in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(candidate, learners)
        if not problem:
            return candidate
        print(f"{name}: skipping a damaged checkpoint: {problem}")
    return None


def load_checkpoint(path: Path, state: TrainerState, learners: Mapping[str, LearnerState], *,
                    metrics_dir: Path) -> dict[str, Any]:
    """Restore the checkpoint ``path`` (checked: :func:`checkpoint_to_load`) into ``state`` and the ``learners``'
    weights and optimizers, keep the metrics of its steps in ``metrics_dir/metrics.jsonl`` and
    ``state.history``, and return its ``state.json``. Every file is read before anything is replaced.

    Raises:
        RunError: a learner's trainable tensors are missing from the checkpoint (another model or LoRA setting).
    """
    saved = read_json(path / "state.json")
    loaded = {}
    for j, learner_state in learners.items():
        where = learner_dir(path, list(learners), j)
        weights = torch.load(where / "trainable.pt", map_location=learner_state.device)
        missing = set(learner_state.trainable_state()) - set(weights)
        if missing:
            raise RunError(f"checkpoint {path} lacks {len(missing)} trainable tensors of {j} (e.g. "
                           f"{sorted(missing)[0]}); was it written with the same model and LoRA settings?")
        loaded[j] = (weights, torch.load(where / "optimizer.pt", map_location=learner_state.device))
    for j, learner_state in learners.items():  # every file read: only now is anything replaced
        weights, optimizer = loaded[j]
        learner_state.policy.model.load_state_dict(weights, strict=False)
        learner_state.optimizer.load_state_dict(optimizer)
        learner_state.mark_updated()
    torch.set_rng_state(torch.load(path / "rng.pt")["torch"])
    state.restore(saved)
    truncate_metrics(state, state.step, metrics_dir)
    return saved


def truncate_metrics(state: TrainerState, step: int, root: Path | None) -> None:
    """Keep the metrics of steps up to ``step`` (the checkpoint resumed from; 0 when none) in
    ``root/metrics.jsonl`` and ``state.history``: a run stopped after its last checkpoint logs those
    steps again, and must not list them twice."""
    if root is None:
        return
    log = root / "metrics.jsonl"
    try:
        text = read_regular(log).decode()
    except FileNotFoundError:
        return
    kept = []
    for line in text.splitlines():
        try:
            if line and json.loads(line)["step"] <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):  # a line cut by a kill: dropped
            continue
    atomic_write_text(log, "".join(line + "\n" for line in kept))
    state.history = [json.loads(line) for line in kept]


def clear_output_dir(output_dir: str | None, state: TrainerState, *, name: str, keep_tensorboard: bool = False) -> None:
    """``fit(resume=False)``: remove the run's checkpoints, metrics and (unless ``keep_tensorboard``: a
    tracker run is still open on them) TensorBoard events in ``output_dir``, and empty ``state.history``
    (the one line saying so is prefixed with ``name``)."""
    if not output_dir or not Path(output_dir).is_dir():
        return
    root = Path(output_dir)
    old = sorted(root.glob("checkpoint-*")) + sorted(root.glob(".tmp-checkpoint-*"))
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    (root / "metrics.jsonl").unlink(missing_ok=True)
    if not keep_tensorboard:
        shutil.rmtree(root / "tensorboard", ignore_errors=True)
    if old:
        print(f"{name}: starting over in {root} (resume=False): removed {len(old)} old checkpoint(s)")
    state.history = []


def save_model(learners: Mapping[str, LearnerState], path: str | Path) -> Path:
    """Each learner's trained policy with ``save_pretrained`` (the adapter only, with LoRA) and its tokenizer,
    in ``path`` (several learners: ``path/<id>``)."""
    path = Path(path)
    for j, state in learners.items():
        where = learner_dir(path, list(learners), j)
        if state.adapter is not None:  # the shared base: this learner's adapter alone
            state.policy.save_adapter(where)
        else:
            state.policy.model.save_pretrained(where)
        state.policy.tokenizer.save_pretrained(where)
    return path
