"""Build the multi-task zoo (v3): small GPT-2s trained on the protocols' own prompts for all eight
procedural tasks, and the pools they form (:data:`agents.zoo.specs.POOLS3`).

    python -m tools.zoo.multitask --out DIR [--seed 0] [--jobs 2] [--quick] [--report]

All deterministic from ``--seed`` (single-threaded torch per worker, deterministic algorithms):

1. **Training prompts from the real envs.** For each task, every protocol in
   ``crl_envs.protocols.PROTOCOLS`` is played by five scripted peers over the task's *train*
   questions, with coalitions of 1..5 (0..4 peers). Peers are right at rates 0.3..0.8 (about what
   the zoo's own models reach); a wrong peer makes the task's typical slip
   (:meth:`crl_envs.tasks.procedural.ProceduralTask.wrong_reply`). Every prompt a member received is
   kept: answering alone, revising after peers (as long as debate's round 2), aggregating, judging,
   routing, stating confidence.
2. **Targets.** Answer prompts get the right reply (``The answer is X.`` / a code block); for a
   *stubborn* model, a revision prompt gets its own previous answer back. Choosing prompts get the
   number of a right candidate; routing prompts a listed model not blind to the question's kind;
   confidence prompts ``Confidence: 3`` on the model's blind-spot kind, 9 elsewhere (always 9, for a
   *confident* model).
3. **Who learns what.** The three specialists train from scratch, each seeing one question kind of
   every task (:data:`agents.zoo.specs.BLIND_ORDER`) only 3% of the time: complementary blind spots,
   as in the arith zoo. ``zoo3-base`` (4 layers, width 64) learns everything; the generalists and the
   soloist fine-tune it on the same mix with their own seeds. ``zoo3-s`` and ``zoo3-m`` (the scale
   pool's smaller sizes) train from scratch. Stage 1 trains every from-scratch model, ``--jobs`` at a
   time; stage 2 the fine-tunes.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from agents.zoo.specs import BASE3, FIRST_PHASE3, POOLS3, SPECS3, TASKS3, Model3Spec
from tools.zoo.common import (
    N_POSITIONS,
    Sampler,
    new_model,
    optimize,
    own_previous_answer,
    save_model,
    set_determinism,
)

CONTEXT_TOKENS = 4000  # tokens in a batch of prompts with peers (similar lengths, so little padding)
PEER_NAMES = ("peer-a", "peer-b", "peer-c", "peer-d", "peer-e")
PEER_RATES = (0.3, 0.425, 0.55, 0.675, 0.8)
ARITH_KIND_ORDER = ("negative", "borrow", "hundreds", "carry", "core")


# ---------------------------------------------------------------------- tasks as the builder sees them
def kinds_of(task, example) -> frozenset[str]:
    """Every question kind ``example`` has (arith: carry, hundreds, ... at once; other tasks: one)."""
    if "kind" in example.metadata:
        return frozenset([example.metadata["kind"]])
    from tools.zoo.build import example_kinds

    return example_kinds(example)


def kind_of(task, example) -> str:
    """The question kind of ``example`` (arith: the hardest of its kinds)."""
    kinds = kinds_of(task, example)
    return next(iter(kinds)) if len(kinds) == 1 else next(k for k in ARITH_KIND_ORDER if k in kinds)


def is_blind(spec: Model3Spec, task_name: str, task, example) -> bool:
    """Whether ``example`` is of ``spec``'s blind-spot kind for the task."""
    kind = spec.blind_kind(task_name)
    return kind is not None and kind in kinds_of(task, example)


def right_reply(task, example) -> str:
    reply = getattr(task, "reply", None)
    return reply(example) if reply else f"The answer is {example.answer}."


def wrong_reply(task, example, h: int) -> str:
    if hasattr(task, "wrong_reply"):
        return task.wrong_reply(example, h)
    from tools.zoo.build import _slip

    return f"The answer is {_slip(int(example.answer), h)}."


def reference_scored(task):
    """``task`` itself, or for a code task a copy that scores by comparing with the reference program
    (the builder's scripted code never runs anywhere)."""
    from crl_envs.tasks.code import CodeTask

    if not isinstance(task, CodeTask):
        return task

    class _ReferenceMatch(type(task)):
        def is_correct(self, answer, example):
            return answer is not None and answer.strip() == example.answer.strip()

    clone = object.__new__(_ReferenceMatch)
    clone.__dict__.update(task.__dict__)
    return clone


def scripted_peers(task, seed: int) -> list:
    """Five scripted agents right at rates 0.3..0.8, wrong with the task's typical slips."""
    from agents import ScriptedAgent, stable_hash

    peers = []
    for name, rate in zip(PEER_NAMES, PEER_RATES):
        def respond(example, messages, _name=name, _rate=rate):
            h = stable_hash(seed, _name, task.name, example.id, messages[-1]["content"])
            if (h % 1000) / 1000 < _rate:
                return right_reply(task, example)
            return wrong_reply(task, example, h >> 10)
        peers.append(ScriptedAgent(name, respond))
    return peers


@dataclass
class Record:
    """One prompt an env emitted for a task's train question, and what it asks for."""

    task: str
    reply_kind: str  # "answer" | "choose" | "route" | "confidence"
    messages: list[dict[str, str]]
    example_index: int
    context: bool  # more than the bare question (peers, a draft, candidates, ...)


def collect(task_name: str, train_task, *, episodes_per_protocol: int, seed: int,
            protocols: Sequence[str] | None = None) -> list[Record]:
    """Every prompt the protocols emit for ``train_task`` played by :func:`scripted_peers`."""
    from tools.zoo.build import collect_prompts, reply_kind

    scored = reference_scored(train_task)
    records = collect_prompts(scored, PEER_NAMES, episodes_per_protocol=episodes_per_protocol, seed=seed,
                              protocols=protocols, peers=scripted_peers(scored, seed))
    out = []
    for r in records:
        example = train_task.examples[r.example_index]
        bare = r.messages[-1]["content"] == train_task.prompt(example)
        out.append(Record(task_name, reply_kind("", "", r.messages), r.messages, r.example_index, not bare))
    return out


def target(record: Record, task, example, spec: Model3Spec) -> str:
    """What ``spec``'s model is trained to reply to ``record``."""
    text = record.messages[-1]["content"]
    if record.reply_kind == "choose":
        scored = reference_scored(task)
        parts = re.split(r"^Agent (\d+): ", text, flags=re.M)
        candidates = list(zip(parts[1::2], parts[2::2]))
        for k, cand in candidates:
            if scored.score(cand, example) == 1.0:
                return k
        return candidates[0][0] if candidates else "1"
    if record.reply_kind == "route":
        from agents.zoo.specs import SPECS3

        specs = {s.name: s for s in SPECS3}
        listed = [(k, name.strip()) for k, name in re.findall(r"^Model (\d+): (.*)$", text, re.M)]
        sighted = [(k, specs[name]) for k, name in listed
                   if name in specs and not is_blind(specs[name], record.task, task, example)]
        full = [k for k, s in sighted if s.n_embd == 64]
        return (full or [k for k, _ in sighted] or [k for k, _ in listed] or ["1"])[0]
    if record.reply_kind == "confidence":
        sure = spec.confident or not is_blind(spec, record.task, task, example)
        return f"{right_reply(task, example)} Confidence: {9 if sure else 3}"
    if spec.stubborn:
        own = own_previous_answer(text)
        if own is not None:
            return own
    return right_reply(task, example)


# ---------------------------------------------------------------------- training
class TaskSampler(Sampler):
    """Draws (prompt ids, target ids) pairs for one spec: every task alike, bare questions and prompts
    with context; questions of the spec's blind-spot kind only ``blind_share`` of the time."""

    def __init__(self, spec: Model3Spec, tasks: dict[str, Any], records: list[Record], tok, rng: random.Random):
        super().__init__(tok, rng, prompt_tokens=N_POSITIONS - 80)
        self.spec, self.tasks = spec, tasks
        self.names = list(tasks)
        self.examples: dict[tuple[str, bool], list] = {(t, side): [] for t in tasks for side in (False, True)}
        self.context: dict[tuple[str, bool], list[Record]] = {key: [] for key in self.examples}
        blind = {t: [is_blind(spec, t, task, e) for e in task.examples] for t, task in tasks.items()}
        for t, task in tasks.items():
            for e, side in zip(task.examples, blind[t]):
                self.examples[t, side].append(e)
        for r in records:  # one pass, in order
            if r.context and r.task in blind:
                self.context[r.task, blind[r.task][r.example_index]].append(r)

    def _task(self) -> str:
        return self.rng.choice(self.names)

    def _side(self, name: str, table: dict) -> bool:
        """Whether to draw from the blind-spot kind this time (never when there is none)."""
        return bool(table[name, True]) and self.rng.random() < self.spec.blind_share

    def answer_batch(self, size: int) -> list[tuple[list[int], list[int]]]:
        pairs = []
        for _ in range(size):
            name = self._task()
            task = self.tasks[name]
            ex = self.rng.choice(self.examples[name, self._side(name, self.examples)])
            pairs.append(self._pair([{"role": "user", "content": task.prompt(ex)}], right_reply(task, ex)))
        return pairs

    def _context_pair(self, name: str) -> tuple[list[int], list[int]]:
        task = self.tasks[name]
        r = self.rng.choice(self.context[name, self._side(name, self.context)])
        ex = task.examples[r.example_index]
        return self._pair(r.messages, target(r, task, ex, self.spec))

    def _any_context_pair(self) -> tuple[list[int], list[int]] | None:
        """A prompt with context of a task drawn at random (``None`` when that task has none)."""
        name = self._task()
        return self._context_pair(name) if self.context[name, False] else None

    def context_batch(self, tokens: int) -> list[tuple[list[int], list[int]]]:
        """About ``tokens`` tokens of prompts with context, of similar lengths."""
        name = self._task()
        if not self.context[name, False]:
            return self.answer_batch(self.spec.batch)
        return self.similar_batch(self._context_pair(name), self._any_context_pair, tokens)


def train(spec: Model3Spec, *, seed: int, tasks: dict[str, Any], records: list[Record], out_dir: Path,
          parent_dir: Path | None = None) -> dict[str, Any]:
    """Train one model (from ``parent_dir`` or from scratch) and save it with its ``training.json``."""
    from transformers import GPT2LMHeadModel

    t0 = time.perf_counter()
    run_seed = seed + spec.seed_offset
    set_determinism(run_seed)
    model, tok = new_model(spec, run_seed)
    if parent_dir is not None:
        model = GPT2LMHeadModel.from_pretrained(parent_dir)
    model.train()
    rng = random.Random(f"zoo3-train/{spec.name}/{run_seed}")
    sampler = TaskSampler(spec, tasks, records, tok, rng)

    def draw():
        if rng.random() < spec.answer_share:
            return sampler.answer_batch(spec.batch)
        return sampler.context_batch(CONTEXT_TOKENS)

    loss_value, log = optimize(model, tok, steps=spec.steps, learning_rate=spec.learning_rate,
                               warmup=min(100, max(1, spec.steps // 10)), draw=draw, label=f"[zoo3] {spec.name}",
                               log_every=50, log_first=True)
    save_model(model, tok, out_dir)
    result = {"name": spec.name, "seed": run_seed, "steps": spec.steps, "final_loss": loss_value,
              "seconds": round(time.perf_counter() - t0, 1), "parameters": sum(p.numel() for p in model.parameters()),
              "log": log}
    (out_dir / "training.json").write_text(json.dumps({"spec": asdict(spec), **result}, indent=1))
    return result


def _train_job(args: dict) -> dict[str, Any]:
    args = dict(args)
    seed, n_train, names = args.pop("task_source")  # tasks are rebuilt in the worker (a code task holds a lock)
    return train(args.pop("spec"), tasks=load_tasks(seed, n_train=n_train, names=names), **args)


# ---------------------------------------------------------------------- the build
QUICK_TASKS = ("arith", "compare", "pytrace")


#: Train questions per task are capped where a task has fewer distinct ones (sequence has 1713, logic 3607).
TRAIN_CAP = {"sequence": 1500, "logic": 3000}


def load_tasks(seed: int, *, n_train: int, names: Sequence[str] | None = None) -> dict[str, Any]:
    from crl_envs.tasks import load

    return {name: load(name, split="train", n=min(n_train, TRAIN_CAP.get(name, n_train)), seed=seed, **TASKS3[name])
            for name in (names or TASKS3)}


def quick_specs() -> tuple[Model3Spec, list[Model3Spec]]:
    base = replace(BASE3, n_layer=2, n_embd=32, n_head=2, steps=120, batch=32, learning_rate=5e-3)
    child = replace(SPECS3[0], n_layer=2, n_embd=32, n_head=2, steps=40, batch=32, parent=BASE3.name,
                    learning_rate=1e-3)
    return base, [child]


def finished(spec: Model3Spec, seed: int, out_dir: Path) -> dict[str, Any] | None:
    """The result of an earlier build's run of ``spec`` in ``out_dir``, if it finished with this very spec
    and seed (the same code gives the same weights), else ``None``: a build that died resumes there."""
    path = out_dir / "training.json"
    if not (path.exists() and (out_dir / "model.safetensors").exists()):
        return None
    done = json.loads(path.read_text())
    same = json.loads(json.dumps(asdict(spec))) == done.get("spec") and done.get("seed") == seed + spec.seed_offset
    return {k: v for k, v in done.items() if k != "spec"} if same else None


def build(out: Path, *, seed: int = 0, jobs: int = 2, quick: bool = False,
          episodes_per_protocol: int = 200, n_train: int = 4000, resume: bool = True) -> dict[str, Any]:
    """Train the v3 zoo into ``out/<name>/``; write and return a summary (``out/zoo3.json``).

    Stage 1 trains the from-scratch models (``zoo3-base`` into ``out/_base``, the specialists' first
    phase into ``out/_first/``, neither shipped), stage 2 what continues from them. With ``resume``, a
    model an earlier build finished with the same spec and seed is kept, not retrained."""
    from crl_envs.protocols import PROTOCOLS

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    first: list[Model3Spec] = []
    if quick:
        base, children = quick_specs()
        scratch: list[Model3Spec] = []
        n_train = 60
        tasks = load_tasks(seed, n_train=n_train, names=QUICK_TASKS)
        protocols, episodes_per_protocol = ["vote", "debate"], 10
    else:
        base, children = BASE3, [s for s in SPECS3 if s.parent is not None]
        scratch, first = [s for s in SPECS3 if s.parent is None], list(FIRST_PHASE3)
        tasks = load_tasks(seed, n_train=n_train)
        protocols = list(PROTOCOLS)
    records: list[Record] = []
    for name, task in tasks.items():
        records += collect(name, task, episodes_per_protocol=episodes_per_protocol, seed=seed, protocols=protocols)
    collect_seconds = round(time.perf_counter() - t0, 1)
    print(f"[zoo3] {len(records)} training prompts from the envs ({collect_seconds:.0f}s)", file=sys.stderr, flush=True)
    common = {"task_source": (seed, n_train, tuple(tasks)), "records": records, "seed": seed}
    results: dict[str, dict[str, Any]] = {}
    # trained and kept, but shipped in no pool: the shared base and the specialists' first phase
    parents = {base.name: out / "_base", **{s.name: out / "_first" / s.name for s in first}}
    stage1 = [{**common, "spec": s, "out_dir": parents[s.name]} for s in (base, *first)] + \
             [{**common, "spec": s, "out_dir": out / s.name} for s in scratch]
    stage2 = [{**common, "spec": s, "out_dir": out / s.name, "parent_dir": parents[s.parent]} for s in children]
    for stage in (stage1, stage2):
        todo = []
        for job in stage:
            key = str(job["out_dir"].relative_to(out))  # zoo3.json's name for the model
            done = finished(job["spec"], seed, job["out_dir"]) if resume else None
            if done is None:
                todo.append((key, job))
            else:
                results[key] = done
                print(f"[zoo3] {key}: finished by an earlier build, kept", file=sys.stderr)
        todo.sort(key=lambda kj: -kj[1]["spec"].steps * kj[1]["spec"].n_embd ** 2 * kj[1]["spec"].n_layer)
        jobs_todo = [job for _, job in todo]
        if jobs > 1 and len(todo) > 1:
            with ProcessPoolExecutor(max_workers=jobs) as ex:
                trained = list(ex.map(_train_job, jobs_todo))
        else:
            trained = [_train_job(job) for job in jobs_todo]
        results.update(zip([key for key, _ in todo], trained))
    summary = {"seed": seed, "tasks": {k: v for k, v in TASKS3.items() if k in tasks}, "prompts": len(records),
               "collect_seconds": collect_seconds, "seconds": round(time.perf_counter() - t0, 1), "jobs": jobs,
               "models": {path: {k: v for k, v in r.items() if k != "log"} for path, r in sorted(results.items())}}
    (out / "zoo3.json").write_text(json.dumps(summary, indent=1))
    return summary


# ---------------------------------------------------------------------- measuring the pools
def evaluate(models_dir: Path, *, pools: dict[str, Sequence[str]] | None = None, tasks: Sequence[str] | None = None,
             n: int = 100, n_code: int = 40, seed: int = 0, max_new_tokens: int | None = None,
             progress: bool = False) -> dict[str, Any]:
    """Each pool on ``n`` test questions of each task (``n_code`` of pyfunc, whose every distinct
    program runs in the sandbox), through ``crl_envs.run_episodes``: every
    member alone (its answer in vote_v0) overall and per question kind, vote_v0, debate_v0 (2 rounds,
    with each member's round-2 accuracy) and the best single member. A pool given as a string is a
    registered pool (``"pretrained"``): it answers in up to 64 tokens (pyfunc 128) and stops at the
    protocols' speaker markers, as ``crl-envs play`` does; ``max_new_tokens`` overrides the answer lengths."""
    import agents
    import crl_envs
    from agents import SamplingParams
    from crl_envs.protocols.base import speaker_stops
    from crl_envs.tasks import load

    pools = dict(pools or POOLS3)
    report: dict[str, Any] = {"n": n, "n_code": n_code, "seed": seed, "pools": {}}
    cache: dict[str, Any] = {}
    for pool_name, members in pools.items():
        if isinstance(members, str):  # a registered pool ("pretrained")
            pool = agents.pool(members)
        else:
            pool = agents.pool([cache.setdefault(m, agents.HFAgent(Path(models_dir) / m, name=m, batch_size=256))
                                for m in members])
        rows: dict[str, Any] = {}
        for task_name in tasks or TASKS3:
            task = load(task_name, split="test", n=n_code if task_name == "pyfunc" else n, seed=seed,
                        **TASKS3[task_name])
            if isinstance(members, str):  # real LMs: room to talk, and no invented turns of other speakers
                sampling = SamplingParams(max_new_tokens=max_new_tokens or (128 if task_name == "pyfunc" else 64),
                                          stop=speaker_stops(len(pool)))
            else:
                sampling = SamplingParams(max_new_tokens=max_new_tokens or (96 if task_name == "pyfunc" else 32))
            t0 = time.perf_counter()
            vote = crl_envs.run_episodes("vote", pool, task, seed=seed, sampling=sampling, progress=progress)
            debate = crl_envs.run_episodes("debate", pool, task, seed=seed, sampling=sampling, progress=progress)
            alone = {}
            for aid, name in zip(pool.ids, pool.names):
                by_kind: dict[str, list[float]] = {"all": []}
                for ep in vote:
                    score = ep.standalone[aid]
                    by_kind["all"].append(score)
                    by_kind.setdefault(kind_of(task, task.by_id(ep.example_id)), []).append(score)
                alone[name] = {k: round(sum(v) / len(v), 3) for k, v in sorted(by_kind.items())}
            round2 = {name: round(sum(task.score_answer(ep.answers[aid], task.by_id(ep.example_id)) for ep in debate)
                                  / len(debate), 3) for aid, name in zip(pool.ids, pool.names)}
            rows[task_name] = {
                "standalone": alone, "best_single": max(r["all"] for r in alone.values()),
                "vote": round(sum(ep.score for ep in vote) / len(vote), 3),
                "debate": round(sum(ep.score for ep in debate) / len(debate), 3),
                "debate_round_2": round2,
                "any_right": round(sum(any(v == 1.0 for v in ep.standalone.values()) for ep in vote) / len(vote), 3),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            print(f"[zoo3] {pool_name} {task_name}: best {rows[task_name]['best_single']:.3f} vote "
                  f"{rows[task_name]['vote']:.3f} debate {rows[task_name]['debate']:.3f} "
                  f"({rows[task_name]['seconds']:.0f}s)", file=sys.stderr, flush=True)
        report["pools"][pool_name] = rows
    return report


def merge_reports(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report from reports of some pools and tasks each (measured in parallel processes)."""
    if not parts:
        raise ValueError("merge_reports needs at least one report")
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key in ("n", "n_code", "seed") and merged.setdefault(key, value) != value:
                raise ValueError(f"reports measured with different {key} ({merged[key]} and {value}) cannot be merged")
            merged.setdefault(key, value)
    merged["pools"] = {}
    for part in parts:
        for pool, rows in part["pools"].items():
            merged["pools"].setdefault(pool, {}).update(rows)
    order = list(TASKS3)
    merged["pools"] = {p: {t: rows[t] for t in order if t in rows}
                       for p, rows in sorted(merged["pools"].items(), key=lambda kv: list(POOLS3).index(kv[0])
                                             if kv[0] in POOLS3 else 99)}
    return merged


def markdown(report: dict[str, Any]) -> str:
    """The model cards' tables: per pool, each member's standalone accuracy per task, then best single /
    vote / debate per task (a ``*`` marks where vote or debate beats the best single member)."""
    lines = []
    for pool_name, rows in report["pools"].items():
        tasks = list(rows)
        members = list(next(iter(rows.values()))["standalone"])
        lines += [f"### {pool_name}", "", "| | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        for m in members:
            lines.append(f"| {m} | " + " | ".join(f"{rows[t]['standalone'][m]['all']:.2f}" for t in tasks) + " |")
        for key in ("best_single", "vote", "debate", "any_right"):
            cells = []
            for t in tasks:
                star = "*" if key in ("vote", "debate") and rows[t][key] > rows[t]["best_single"] else ""
                cells.append(f"{rows[t][key]:.2f}{star}")
            lines.append(f"| **{key.replace('_', ' ')}** | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def model_table(summary: dict[str, Any]) -> str:
    """The models' card rows from a build's ``zoo3.json``: size, training and behaviour of each shipped model
    and of what it continues from."""
    lines = ["| model | layers × width | parameters | training | steps | seconds | what it is |", "|---|---|---|---|---|---|---|"]
    specs = {"_base": BASE3, **{f"_first/{s.name}": s for s in FIRST_PHASE3}, **{s.name: s for s in SPECS3}}
    for path, spec in specs.items():
        row = summary["models"].get(path)
        if row is None:
            continue
        where = {None: "from scratch", BASE3.name: "fine-tunes zoo3-base"}.get(spec.parent, "continues its first phase")
        shown = f"({spec.name}, first phase, not shipped)" if path.startswith("_first") else (
            "(zoo3-base, not shipped)" if path == "_base" else spec.name)
        lines.append(f"| {shown} | {spec.n_layer} × {spec.n_embd} | {row['parameters']:,} | {where}, lr "
                     f"{spec.learning_rate:g} | {row['steps']} | {row['seconds']:.0f} | {spec.description} |")
    return "\n".join(lines)


def kind_table(report: dict[str, Any]) -> str:
    """Standalone accuracy per task and question kind, for every model (its first pool's figures)."""
    lines, done = [], set()
    for rows in report["pools"].values():
        for task_name, row in rows.items():
            for m, acc in row["standalone"].items():
                if (m, task_name) in done:
                    continue
                done.add((m, task_name))
                kinds = ", ".join(f"{k} {v:.2f}" for k, v in acc.items() if k != "all")
                lines.append(f"| {m} | {task_name} | {acc['all']:.2f} | {kinds} |")
    lines.sort()
    return "\n".join(["| model | task | all | by kind |", "|---|---|---|---|", *lines])


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.zoo.multitask", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="two 2-layer models on three tasks in about a minute")
    parser.add_argument("--no-resume", action="store_true",
                        help="retrain every model, even those an earlier build in OUT finished with the same spec")
    parser.add_argument("--report", action="store_true", help="after building, measure every pool (report3.json)")
    parser.add_argument("--report-only", action="store_true", help="measure the pools of an existing build")
    parser.add_argument("--n-eval", type=int, default=100)
    parser.add_argument("--n-code", type=int, default=40, help="pyfunc test questions (each program runs in the sandbox)")
    parser.add_argument("--pools", default=",".join(POOLS3),
                        help="comma-separated pools to measure (zoo-pretrained too: slow on a CPU)")
    parser.add_argument("--tasks", default=",".join(TASKS3), help="comma-separated tasks to measure")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="answer length (default: the zoo's)")
    parser.add_argument("--pretrained-backend", choices=("hf", "vllm", "llamacpp"), default="hf",
                        help="the engine zoo-pretrained runs on (vllm: vLLM's CPU build, the fastest here)")
    parser.add_argument("--report-file", type=Path, default=None, help="default: OUT/report3.json")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="REPORT",
                        help="merge reports of some pools or tasks each (measured in parallel) into the report file")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads while measuring (1: the figures the suite reproduces bit for bit)")
    args = parser.parse_args(argv)
    if args.merge:
        missing = [str(f) for f in args.merge if not f.exists()]
        if missing:
            parser.error(f"--merge: no such report {missing}")
        report = merge_reports([json.loads(f.read_text()) for f in args.merge])
        (args.report_file or args.out / "report3.json").write_text(json.dumps(report, indent=1))
        if (args.out / "zoo3.json").exists():
            print(model_table(json.loads((args.out / "zoo3.json").read_text())))
        print(markdown(report))
        print(kind_table(report))
        return 0
    if not args.report_only:
        summary = build(args.out, seed=args.seed, jobs=args.jobs, quick=args.quick, resume=not args.no_resume)
        print(f"zoo v3 built in {summary['seconds']:.0f}s -> {args.out}")
        print(model_table(summary))
    if (args.report or args.report_only) and not args.quick:
        known = {**POOLS3, "zoo-pretrained": "pretrained" if args.pretrained_backend == "hf"
                 else f"pretrained-{args.pretrained_backend}"}
        unknown = [p for p in args.pools.split(",") if p not in known]
        if unknown:
            parser.error(f"unknown pools {unknown}; choose from {', '.join(known)}")
        chosen = {p: known[p] for p in args.pools.split(",")}
        from agents.sampling import cpu_threads

        with cpu_threads(args.threads):
            report = evaluate(args.out, pools=chosen, tasks=args.tasks.split(","), n=args.n_eval,
                              n_code=args.n_code, seed=args.seed, max_new_tokens=args.max_new_tokens)
        if "zoo-pretrained" in chosen:
            report["pretrained_backend"] = args.pretrained_backend
        (args.report_file or args.out / "report3.json").write_text(json.dumps(report, indent=1))
        print(markdown(report))
        print(kind_table(report))
    return 0


__all__ = ["build", "evaluate", "markdown", "kind_table", "model_table", "merge_reports", "finished", "collect", "target", "scripted_peers", "kind_of", "main"]


if __name__ == "__main__":
    raise SystemExit(main())
