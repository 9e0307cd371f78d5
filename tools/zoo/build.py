"""Build the zoo: train its small GPT-2s from a seed on the protocols' own prompts.

    python -m tools.zoo.build --out DIR [--seed 0] [--jobs 2] [--quick]
    python -m tools.zoo.multitask --out DIR [--report]   (the multi-task zoo, v3: its own module)

What happens, all deterministic from ``--seed``:

1. **Training prompts from the real envs.** Every protocol in ``crl_envs.protocols.PROTOCOLS`` is
   played by scripted peers (right at realistic, per-peer rates; wrong answers are the slips real
   models make: a dropped carry, a wrong digit, a lost sign) over arith *train* questions, with
   coalitions of 1..5 members so a model sees 0..4 peers. Every prompt an agent received is kept
   as chat messages and rendered with the model's own chat template.
2. **Targets.** Prompts that ask for an answer get ``"The answer is N."`` with N the true result
   (revising, aggregating, fusing, reviewing, ...: the correct answer given everything shown);
   prompts that ask to pick a candidate get the number of a correct candidate; routing prompts get
   the number of a listed model that is not blind to the question's kind; cascade's confidence
   prompt gets ``Confidence: 9`` on questions the model was trained on, ``3`` on its blind spot.
3. **A base, then specialists.** A base model learns the format and the carry-free core (sums and
   differences that need no carry, no borrow, no hundreds and no sign). Each specialist continues
   from it on the full task where one question kind (its *blind spot*) is only ``blind_share`` of
   the mix; ``zoo-mini`` is a smaller model trained from scratch on everything, briefly.
4. **Verify.** Each model is checked on held-out train questions; a run that stays on the loss
   plateau is retrained with the next seed. Finally every model's standalone accuracy on the
   task's test split is printed, measured through ``crl_envs.run_episodes``.

Torch runs single-threaded per worker, with deterministic algorithms, so the same seed gives the
same weights whatever ``--jobs`` is.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agents.zoo.specs import (
    BASE,
    QUICK_SPEC,
    QUICK_TASK_OPTIONS,
    SPECS,
    SPECS4,
    TASK_OPTIONS,
    Model4Spec,
    ModelSpec,
)
from tools.zoo.common import (
    N_POSITIONS,
    Sampler,
    new_model,
    optimize,
    own_previous_answer,
    save_model,
    set_determinism,
)

KINDS = ("add", "sub", "carry", "borrow", "hundreds", "negative", "core")
KIND_HELP = {
    "carry": "additions whose units carry (47 + 85)",
    "borrow": "subtractions whose units borrow (52 - 17)",
    "hundreds": "sums of 100 or more (63 + 58)",
    "negative": "subtractions with a negative result (23 - 61)",
    "core": "no carry, no borrow, result in 0..99 (23 + 45, 87 - 12)",
}


def question_kinds(a: int, op: str, b: int) -> frozenset[str]:
    """The kinds of an arith question ``a op b``: ``add``/``sub`` plus what makes it hard."""
    out = set()
    if op == "+":
        out.add("add")
        if a % 10 + b % 10 >= 10:
            out.add("carry")
        if a + b >= 100:
            out.add("hundreds")
    elif op == "-":
        out.add("sub")
        if a % 10 < b % 10:
            out.add("borrow")
        if a < b:
            out.add("negative")
    else:
        raise ValueError(f"the zoo knows + and -, got operation {op!r}")
    if not out & {"carry", "hundreds", "borrow", "negative"}:
        out.add("core")
    return frozenset(out)


def example_kinds(example) -> frozenset[str]:
    m = example.metadata
    return question_kinds(int(m["a"]), m["op"], int(m["b"]))


ANSWER_BATCH = 64
CONTEXT_TOKENS = 3200  # tokens in a batch of prompts with peers (similar lengths, so little padding)


# ---------------------------------------------------------------------- training prompts
@dataclass
class PromptRecord:
    """One prompt an env emitted: what kind of reply it asks for, its messages and its question."""

    kind: str  # "answer" | "choose" | "route" | "confidence"
    messages: list[dict[str, str]]
    example_index: int
    kinds: frozenset[str] = field(default_factory=frozenset)


def reply_kind(protocol: str, phase: str, messages: Sequence[dict[str, str]]) -> str:
    """What a prompt asks for, read from its last user message."""
    text = messages[-1]["content"]
    if "Confidence" in text:
        return "confidence"
    if re.search(r"Reply (with its number|\d+ or \d+)", text):
        return "route" if re.search(r"^Model \d+:", text, re.M) else "choose"
    return "answer"


def _slip(value: int, h: int) -> int:
    """A plausible wrong result: a dropped or extra carry, a digit off by one, or a lost sign."""
    choice = h % 5
    if choice == 0:
        wrong = value + (10 if (h >> 3) % 2 else -10)
    elif choice == 1:
        wrong = value + (1 if (h >> 3) % 2 else -1)
    elif choice == 2 and value != 0:
        wrong = -value
    elif choice == 3:
        wrong = value + (100 if value < 50 else -100)
    else:
        wrong = value + 1 + (h >> 4) % 9
    return wrong if wrong != value else value + 1


def scripted_peers(names: Sequence[str], seed: int):
    """Scripted agents standing in for the zoo while collecting prompts: right at rates 0.5..0.9."""
    from agents import ScriptedAgent, stable_hash

    rates = [0.5 + 0.4 * k / max(1, len(names) - 1) for k in range(len(names))]
    peers = []
    for name, rate in zip(names, rates):
        def respond(example, messages, _name=name, _rate=rate):
            h = stable_hash(seed, _name, example.id, messages[-1]["content"])
            truth = int(example.answer)
            right = (h % 1000) / 1000 < _rate
            return f"The answer is {truth if right else _slip(truth, h >> 10)}."
        peers.append(ScriptedAgent(name, respond))
    return peers


def collect_prompts(train_task, names: Sequence[str], *, episodes_per_protocol: int, seed: int,
                    protocols: Sequence[str] | None = None, peers: Sequence | None = None) -> list[PromptRecord]:
    """Play every protocol with scripted peers over train questions; keep every prompt emitted.
    ``peers``: the scripted agents (default: :func:`scripted_peers` for arith)."""
    import agents
    import crl_envs
    from crl_envs.protocols import PROTOCOLS

    pool = agents.pool(list(peers) if peers is not None else scripted_peers(names, seed))
    index = {e.id: i for i, e in enumerate(train_task.examples)}
    rng = random.Random(f"zoo-prompts/{seed}")
    records: list[PromptRecord] = []
    for protocol in protocols or list(PROTOCOLS):
        per_size = max(1, episodes_per_protocol // len(names))
        for size in range(1, len(names) + 1):
            coalition = sorted(rng.sample(range(len(names)), size))
            chosen = rng.sample(range(len(train_task)), per_size)
            try:
                episodes = crl_envs.run_episodes(protocol, pool, train_task, coalition=coalition, examples=chosen,
                                                 seed=seed, progress=False)
            except Exception as e:  # a protocol mid-development must not block the zoo; say so
                print(f"[zoo] skipped protocol {protocol!r} with {size} members: {e}", file=sys.stderr)
                continue
            for ep in episodes:
                ex_index = index[ep.example_id]
                for turn in ep.transcript:
                    records.append(PromptRecord(reply_kind(protocol, turn.phase_name, turn.messages), turn.messages,
                                                ex_index))
    return records


def target_text(record: PromptRecord, example, spec: ModelSpec, names: Sequence[str]) -> str:
    """What the model is trained to reply to ``record``."""
    truth = example.answer
    text = record.messages[-1]["content"]
    if record.kind == "choose":
        from crl_envs.tasks import extract_number

        candidates = re.findall(r"^Agent (\d+): (.*)$", text, re.M)
        for k, cand in candidates:
            if extract_number(cand) == truth:
                return k
        return candidates[0][0] if candidates else "1"
    if record.kind == "route":
        listed = re.findall(r"^Model (\d+): (.*)$", text, re.M)
        kinds = record.kinds
        good = [k for k, name in listed if not _blind_of(name.strip()) & kinds and name.strip() != "zoo-mini"]
        fallback = [k for k, name in listed if not _blind_of(name.strip()) & kinds]
        pick = (good or fallback or [k for k, _ in listed] or ["1"])[0]
        return pick
    if record.kind == "confidence":
        confident = spec.confident or not spec.blind_kinds() & record.kinds
        return f"The answer is {truth}. Confidence: {9 if confident else 3}"
    if spec.stubborn:
        own = own_previous_answer(text)
        if own is not None:
            return own
    return f"The answer is {truth}."


@functools.cache
def _blind_spots() -> dict[str, frozenset[str]]:
    """Each zoo model's blind spots (v1 and v4) by the names it goes by, the first spec's where two
    specs share a name: built once, read for every routing prompt."""
    table: dict[str, frozenset[str]] = {}
    for s in (*SPECS, *SPECS4):
        for name in (s.name, *(s.outputs() if isinstance(s, Model4Spec) else ())):
            table.setdefault(name, s.blind_kinds())
    return table


def _blind_of(name: str) -> frozenset[str]:
    """The blind spots of the zoo model (v1 or v4) called ``name``; none for any other name."""
    return _blind_spots().get(name, frozenset())


# ---------------------------------------------------------------------- training
class ArithSampler(Sampler):
    """Draws training (prompt ids, target ids) pairs for one spec: its mix of question kinds."""

    def __init__(self, spec: ModelSpec, train_task, records: list[PromptRecord], names: Sequence[str], tok,
                 rng: random.Random, *, core_only: bool = False):
        super().__init__(tok, rng, prompt_tokens=N_POSITIONS - 24)
        self.spec, self.task, self.names = spec, train_task, names
        kinds = [example_kinds(e) for e in train_task.examples]
        self.kinds = kinds
        if core_only:
            ok = [i for i, k in enumerate(kinds) if "core" in k]
            self.normal, self.blind = ok, []
        else:
            blind_kinds = spec.blind_kinds()
            self.blind = [i for i, k in enumerate(kinds) if blind_kinds & k]
            blind_set = set(self.blind)
            self.normal = [i for i in range(len(kinds)) if i not in blind_set]
        blind_set = set(self.blind)
        keep = set(self.normal) | blind_set
        self.context_normal = [r for r in records if r.example_index in keep and r.example_index not in blind_set
                               and len(r.messages) > 0 and _has_context(r)]
        self.context_blind = [r for r in records if r.example_index in blind_set and _has_context(r)]

    def _blind_draw(self) -> bool:
        return bool(self.blind) and self.rng.random() < self.spec.blind_share

    def answer_pair(self) -> tuple[list[int], list[int]]:
        i = self.rng.choice(self.blind if self._blind_draw() else self.normal)
        ex = self.task.examples[i]
        messages = [{"role": "user", "content": self.task.prompt(ex)}]
        return self._pair(messages, f"The answer is {ex.answer}.")

    def context_batch(self, tokens: int) -> list[tuple[list[int], list[int]]]:
        """About ``tokens`` tokens of prompts with peers, all of similar length (little padding)."""
        return self.similar_batch(self._context_pair(), self._context_pair, tokens)

    def _context_pair(self) -> tuple[list[int], list[int]]:
        pool = self.context_blind if (self._blind_draw() and self.context_blind) else self.context_normal
        r = self.rng.choice(pool)
        ex = self.task.examples[r.example_index]
        return self._pair(r.messages, target_text(r, ex, self.spec, self.names))


def _has_context(r: PromptRecord) -> bool:
    return "\n" in r.messages[-1]["content"]


def greedy_accuracy(model, tok, examples, *, max_new_tokens: int = 12) -> float:
    """Quick check during the build (held-out *train* questions): greedy answer-alone accuracy."""
    import torch

    from crl_envs.tasks import extract_number

    model.eval()
    right = 0
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": e.question}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for e in examples]
    with torch.no_grad():
        for start in range(0, len(examples), 100):
            chunk = prompts[start : start + 100]
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), tok.pad_token_id)
            att = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, p in enumerate(chunk):
                ids[r, width - len(p):] = torch.tensor(p)
                att[r, width - len(p):] = 1
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new_tokens + 8,
                                 do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            for r, e in enumerate(examples[start : start + 100]):
                text = tok.decode(out[r, width:], skip_special_tokens=True)
                right += extract_number(text) == e.answer
    model.train()
    return right / len(examples)


@dataclass
class TrainResult:
    name: str
    seed: int
    steps: int
    final_loss: float
    validation: float
    seconds: float
    attempts: int
    log: list[dict[str, float]]


def train(spec: ModelSpec, *, seed: int, train_task, records, names, validation, out_dir: Path,
          base_dir: Path | None = None, core_only: bool = False, min_validation: float = 0.0,
          max_attempts: int = 3, eval_every: int = 0, checkpoints: dict[int, Path] | None = None) -> TrainResult:
    """Train one model (retrying with the next seed while it stays under ``min_validation``); save it.

    ``checkpoints``: step count -> directory; the run is also saved there after that many steps, with
    its validation accuracy then (the last attempt's). Each saved model's ``training.json`` records
    the spec and ``requested_seed`` (``seed``), which a resuming build compares."""
    from transformers import GPT2LMHeadModel

    t0 = time.perf_counter()
    checkpoints = dict(checkpoints or {})
    if any(not 0 < c <= spec.steps for c in checkpoints):
        raise ValueError(f"checkpoints {sorted(checkpoints)} of {spec.name} must lie in 1..{spec.steps} steps")
    for attempt in range(max_attempts):
        run_seed = seed + 1000 * attempt
        set_determinism(run_seed)
        model, tok = new_model(spec, run_seed)
        if spec.from_base and base_dir is not None:
            model = GPT2LMHeadModel.from_pretrained(base_dir)
        model.train()
        rng = random.Random(f"zoo-train/{spec.name}/{run_seed}")
        sampler = ArithSampler(spec, train_task, records, names, tok, rng, core_only=core_only)

        def draw(sampler=sampler, rng=rng):
            if rng.random() < spec.answer_share or not sampler.context_normal:
                return [sampler.answer_pair() for _ in range(ANSWER_BATCH)]
            return sampler.context_batch(CONTEXT_TOKENS)

        def validate(step, model=model, tok=tok):
            if eval_every and (step + 1) % eval_every == 0 and step + 1 < spec.steps:
                return {"validation": greedy_accuracy(model, tok, validation[:100])}
            return {}

        saved: dict[int, float] = {}

        def save_checkpoint(done, model=model, tok=tok, saved=saved, run_seed=run_seed):
            if done in checkpoints:
                saved[done] = greedy_accuracy(model, tok, validation)
                save_model(model, tok, checkpoints[done])
                (checkpoints[done] / "training.json").write_text(json.dumps(
                    {"spec": asdict(spec), "requested_seed": seed, "seed": run_seed, "checkpoint": done,
                     "validation": saved[done], "seconds": round(time.perf_counter() - t0, 1)}, indent=1))

        loss_value, log = optimize(model, tok, steps=spec.steps, learning_rate=spec.learning_rate, warmup=100,
                                   draw=draw, label=f"[zoo] {spec.name}", log_every=100, extra=validate,
                                   after_step=save_checkpoint if checkpoints else None)
        val = greedy_accuracy(model, tok, validation)
        print(f"[zoo] {spec.name} attempt {attempt + 1}: validation accuracy {val:.3f}", file=sys.stderr, flush=True)
        if val >= min_validation or attempt == max_attempts - 1:
            break
    save_model(model, tok, out_dir)
    result = TrainResult(spec.name, run_seed, spec.steps, loss_value, val, round(time.perf_counter() - t0, 1),
                         attempt + 1, log)
    (out_dir / "training.json").write_text(json.dumps({"spec": asdict(spec), "requested_seed": seed,
                                                       **asdict(result)}, indent=1))
    return result


# ---------------------------------------------------------------------- the build
def load_train_data(seed: int, *, n_train: int, n_validation: int, names: Sequence[str],
                    episodes_per_protocol: int, protocols: Sequence[str] | None = None,
                    task_options: dict[str, Any] | None = None):
    from crl_envs.tasks import load

    full = load("arith", split="train", n=n_train + n_validation, seed=seed, **(task_options or TASK_OPTIONS))
    train_task = full.subset([e.id for e in full.examples[:n_train]])
    validation = full.examples[n_train:]
    records = collect_prompts(train_task, names, episodes_per_protocol=episodes_per_protocol, seed=seed,
                              protocols=protocols)
    for r in records:
        r.kinds = example_kinds(train_task.examples[r.example_index])
    return train_task, validation, records


def _train_job(args: dict) -> TrainResult:
    return train(args.pop("spec"), **args)


def build(out: Path, *, seed: int = 0, jobs: int = 2, quick: bool = False, specs: Sequence[ModelSpec] | None = None,
          evaluate: bool = True, n_eval: int = 500, base: Path | None = None) -> dict[str, Any]:
    """Train the zoo into ``out/<name>/`` and return a summary (also written to ``out/zoo.json``).

    ``base``: a base model already trained by an earlier build with the same seed (``OUT/_base``);
    the build then trains only the specialists from it.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    specs = [QUICK_SPEC] if quick else list(specs or SPECS)
    task_options = QUICK_TASK_OPTIONS if quick else TASK_OPTIONS
    names = [s.name for s in (SPECS if not quick else specs)]
    train_task, validation, records = load_train_data(
        seed, n_train=130 if quick else 12000, n_validation=20 if quick else 200, names=names,
        episodes_per_protocol=40 if quick else 400, protocols=["vote", "debate"] if quick else None,
        task_options=task_options)
    print(f"[zoo] {len(records)} training prompts from the envs ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    common = {"train_task": train_task, "validation": validation, "records": records, "names": names}
    results: dict[str, TrainResult] = {}
    base_dir = None
    if base is not None:
        base_dir = Path(base)
        if not (base_dir / "config.json").exists():
            raise FileNotFoundError(f"--base {base_dir} holds no model; pass the _base folder of an earlier build")
    elif not quick and any(s.from_base for s in specs):
        base_dir = out / "_base"
        results[BASE.name] = _train_job({**common, "spec": BASE, "seed": seed, "out_dir": base_dir,
                                         "core_only": True, "min_validation": 0.15, "eval_every": 400})
    todo = [{**common, "spec": s, "seed": seed + 1 + k, "out_dir": out / s.name,
             "base_dir": base_dir if s.from_base else None, "min_validation": 0.15 if not quick else 0.0,
             "max_attempts": 1 if quick else 2, "eval_every": 0 if quick else 400}
            for k, s in enumerate(specs)]
    # longest jobs first so the two workers finish together
    todo.sort(key=lambda j: -j["spec"].steps * j["spec"].n_embd)
    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            for r in ex.map(_train_job, todo):
                results[r.name] = r
    else:
        for j in todo:
            r = _train_job(j)
            results[r.name] = r
    summary: dict[str, Any] = {"seed": seed, "task": {"name": "arith", **task_options}, "train_seconds":
                               round(time.perf_counter() - t0, 1), "models": {}}
    for s in specs:
        r = results[s.name]
        summary["models"][s.name] = {"blind": s.blind, "description": s.description, "validation": r.validation,
                                     "seconds": r.seconds, "attempts": r.attempts, "seed": r.seed}
    if evaluate:
        summary["standalone"] = standalone_table([out / s.name for s in specs], n=40 if quick else n_eval, seed=seed,
                                                 task_options=task_options)
    (out / "zoo.json").write_text(json.dumps(summary, indent=1))
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    return summary


def standalone_table(model_dirs: Sequence[Path], *, n: int = 500, seed: int = 0,
                     task_options: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
    """Each model alone (vote_v0 with a one-member coalition) on ``n`` test questions: accuracy overall
    and per question kind."""
    import agents
    import crl_envs
    from agents import SamplingParams
    from crl_envs.tasks import load

    task = load("arith", split="test", n=n, seed=seed, **(task_options or TASK_OPTIONS))
    pool = agents.pool([agents.HFAgent(d, name=Path(d).name, batch_size=256) for d in model_dirs])
    table = {}
    for agent_id, name in zip(pool.ids, pool.names):
        eps = crl_envs.run_episodes("vote", pool, task, coalition=[agent_id], progress=False,
                                    sampling=SamplingParams(max_new_tokens=24))
        table[name] = kind_accuracy(eps, task)
    return table


def kind_accuracy(episodes, task) -> dict[str, float]:
    """Accuracy overall and per question kind of ``episodes`` (one per example)."""
    by_kind: dict[str, list[float]] = {"all": []}
    for ep in episodes:
        by_kind["all"].append(ep.score)
        for k in example_kinds(task.by_id(ep.example_id)):
            by_kind.setdefault(k, []).append(ep.score)
    return {k: round(sum(v) / len(v), 3) for k, v in sorted(by_kind.items())}


def system_report(model_dirs: Sequence[Path] | None = None, *, n: int = 500, seed: int = 0,
                  progress: bool = False) -> dict[str, Any]:
    """The zoo in the protocols, on ``n`` test questions, all through ``crl_envs.run_episodes``:
    each model alone, vote_v0 and debate_v0 of the whole zoo (with how many answers debate's second
    round changed), and each model's leave-one-out contribution to vote, v(N) - v(N minus i)."""
    import agents
    import crl_envs
    from agents import SamplingParams
    from crl_envs.tasks import load

    if model_dirs is None:
        from agents.zoo import load as load_zoo

        pool = load_zoo()
    else:
        pool = agents.pool([agents.HFAgent(d, name=Path(d).name, batch_size=256) for d in model_dirs])
    task = load("arith", split="test", n=n, seed=seed, **TASK_OPTIONS)
    sampling = SamplingParams(max_new_tokens=24)

    def run(protocol: str, coalition=None):
        return crl_envs.run_episodes(protocol, pool, task, coalition=coalition, seed=seed, sampling=sampling,
                                     progress=progress)

    def mean(xs):
        return round(sum(xs) / len(xs), 4)

    alone = {name: kind_accuracy(run("vote", [aid]), task) for aid, name in zip(pool.ids, pool.names)}
    vote = run("vote")
    debate = run("debate")
    changed = sum(
        1 for ep in debate for a in ep.coalition
        if task.extract(ep.turns_of(a)[0].text) != task.extract(ep.turns_of(a)[-1].text)
    )
    round1 = {a: mean([ep.standalone[a] for ep in debate]) for a in pool.ids}
    round2 = {a: mean([task.score_answer(ep.answers[a], task.by_id(ep.example_id)) for ep in debate]) for a in pool.ids}
    v_all = mean([ep.score for ep in vote])
    loo = {}
    for aid, name in zip(pool.ids, pool.names):
        rest = [b for b in pool.ids if b != aid]
        loo[name] = round(v_all - mean([ep.score for ep in run("vote", rest)]), 4)
    any_right = mean([float(any(v == 1.0 for v in ep.standalone.values())) for ep in vote])
    return {
        "n": n, "seed": seed, "task": {"name": "arith", **TASK_OPTIONS},
        "standalone": alone,
        "best_single": max(r["all"] for r in alone.values()),
        "any_right": any_right,
        "vote": {"accuracy": v_all, "by_kind": kind_accuracy(vote, task)},
        "debate": {"accuracy": mean([ep.score for ep in debate]), "by_kind": kind_accuracy(debate, task),
                   "answers_changed_in_round_2": changed, "answers": n * len(pool),
                   "round_1_accuracy": dict(zip(pool.names, round1.values())),
                   "round_2_accuracy": dict(zip(pool.names, round2.values()))},
        "vote_leave_one_out": loo,
    }


def markdown_table(report: dict[str, Any]) -> str:
    """The zoo's table (standalone accuracy per question kind, blind spot, leave-one-out to vote) as markdown."""
    kinds = ["core", "carry", "hundreds", "borrow", "negative"]
    lines = ["| model | blind spot | standalone | " + " | ".join(kinds) + " | LOO to vote |",
             "|---|---|---|" + "---|" * len(kinds) + "---|"]
    specs = {s.name: s for s in SPECS}
    for name, row in report["standalone"].items():
        spec = specs.get(name)
        blind = spec.blind if spec and spec.blind else "(none: brief training)"
        cells = " | ".join(f"{row.get(k, float('nan')):.2f}" for k in kinds)
        lines.append(f"| {name} | {blind} | {row['all']:.3f} | {cells} | {report['vote_leave_one_out'][name]:+.3f} |")
    d = report["debate"]
    lines += [
        "",
        f"On {report['n']} arith test questions (seed {report['seed']}, greedy): best single model "
        f"{report['best_single']:.3f}; at least one model right {report['any_right']:.3f}; "
        f"vote_v0 {report['vote']['accuracy']:.3f}; debate_v0 (2 rounds) {d['accuracy']:.3f}; debate's round 2 "
        f"changed {d['answers_changed_in_round_2']} of {d['answers']} answers.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--v3" in argv:  # the multi-task zoo is built by its own module, which imports this one
        raise SystemExit("the v3 zoo (the zoo-<name> pools) is built by `python -m tools.zoo.multitask "
                         "--out DIR`; `python -m tools.zoo.build` builds the arith zoo")
    parser = argparse.ArgumentParser(prog="python -m tools.zoo.build", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write the models into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="models trained in parallel (one CPU thread each)")
    parser.add_argument("--quick", action="store_true", help="one small model in under a minute (for tests)")
    parser.add_argument("--n-eval", type=int, default=500, help="test questions for the standalone table")
    parser.add_argument("--base", type=Path, default=None,
                        help="reuse the _base model of an earlier build with the same seed (skips its training)")
    parser.add_argument("--report", action="store_true",
                        help="after building, play vote/debate/leave-one-out on the test questions (writes report.json)")
    args = parser.parse_args(argv)
    summary = build(args.out, seed=args.seed, jobs=args.jobs, quick=args.quick, n_eval=args.n_eval, base=args.base)
    print(f"zoo built in {summary['seconds']:.0f}s -> {args.out}")
    for name, row in summary.get("standalone", {}).items():
        kinds = "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "all")
        print(f"{name:14s} standalone {row['all']:.3f}   {kinds}")
    if args.report and not args.quick:
        report = system_report([args.out / s.name for s in SPECS], n=args.n_eval, seed=args.seed)
        (args.out / "report.json").write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in report.items() if k != "standalone"}, indent=1))
        print(markdown_table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
