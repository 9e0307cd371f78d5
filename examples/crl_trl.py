"""C-RL on TRL's GRPOTrainer: the zoo's judge setup on CPU, optionally next to CRLTrainer.

The learner (zoo-rookie, ``model_4``) is a candidate and the judge of ``judge_v0``; the rollout function
(:class:`trainers.trl.CRLRollout`) plays the protocol for every prompt row through the runner, with
TRL's current model as the learner, and rewards each of the learner's two turns with the system's score.

    python examples/crl_trl.py --steps 24                 # TRL only (CPU, ~10 min on 2 busy cores)
    python examples/crl_trl.py --steps 24 --compare-crl   # also CRLTrainer, same steps, lr, G and questions
    accelerate launch --multi_gpu --num_processes 2 examples/crl_trl.py --steps 2  # DDP, 2 CPU processes (gloo)

(Without GPUs, ``--multi_gpu`` is what starts 2 processes: it is accelerate's torchrun launcher, which falls
back to gloo on CPU; ``--cpu --num_processes 2`` starts only one process unless MPI is installed.)

On GPUs, with a real learner and partners served by vLLM (one node, 8 GPUs: GPU 0 serves the learner for
TRL, GPU 1 the partners, GPUs 2-7 train; the same script, or your own with the same three calls)::

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct --port 8000 &
    CUDA_VISIBLE_DEVICES=1 vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8001 &
    CUDA_VISIBLE_DEVICES=2,3,4,5,6,7 accelerate launch --num_processes 6 examples/crl_trl.py \\
        --learner-model hf:Qwen/Qwen2.5-1.5B-Instruct \\
        --partners "openai:http://localhost:8001/v1#meta-llama/Llama-3.1-8B-Instruct" \\
        --task gsm8k --protocol judge --judge model_0 --turns 2 --steps 200 --lr 1e-6 \\
        --max-new-tokens 512 --use-vllm --vllm-server-port 8000 --lora

``--use-vllm`` sets ``GRPOConfig(use_vllm=True, vllm_mode="server")``: TRL pushes the trained weights
(the merged LoRA adapter with ``--lora``) to ``trl vllm-serve`` before every rollout call, and the learner's
turns are generated there; partners are any pool spec (``vllm:``/``openai:`` servers). ``--lora`` trains a
LoRA adapter through TRL's ``peft_config`` (r=16, all linear layers).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import agents
import agents.zoo
import trainers
from crl_envs import tasks
from trainers import trl as crl_trl


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--questions", type=int, default=8, help="questions per optimizer step (over all processes)")
    p.add_argument("--generations", type=int, default=8, help="G, system episodes per question")
    p.add_argument("--lr", type=float, default=1e-4,
                   help="1e-4: trainers.controls.FULL_FINETUNE_LR_BOUND for a full fine-tune (issue #46)")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--eval-questions", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--protocol", default="judge")
    p.add_argument("--judge", default="model_4", help="protocol_options['judge'] (judge protocol only)")
    p.add_argument("--learner", default="model_4")
    p.add_argument("--turns", type=int, default=2, help="the learner's turns per episode (judge: candidate + judge)")
    p.add_argument("--task", default="arith")
    p.add_argument("--learner-model", default=None, help="a spec for the learner instead of the zoo's model")
    p.add_argument("--partners", nargs="*", default=None, help="pool specs of the other agents (default: the zoo)")
    p.add_argument("--use-vllm", action="store_true")
    p.add_argument("--vllm-server-port", type=int, default=8000)
    p.add_argument("--lora", action="store_true")
    p.add_argument("--compare-crl", action="store_true", help="also train CRLTrainer with the same settings")
    p.add_argument("--out", default="runs/crl_trl", help="output directory (results.json goes here)")
    return p.parse_args()


def build_pool(args) -> agents.Pool:
    if args.learner_model is None and args.partners is None:
        return agents.pool("zoo")
    members = list(args.partners or [])
    members.insert(int(args.learner.split("_")[1]), args.learner_model)
    return agents.pool(members)


def main() -> None:
    args = parse()
    torch.set_num_threads(1)  # tiny models on a busy CPU: one thread is several times faster
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    pool = build_pool(args)
    options = agents.zoo.TASK_OPTIONS if args.task == "arith" else {}
    train = tasks.load(args.task, split="train", n=1000, **options)
    held_out = tasks.load(args.task, split="test", n=args.eval_questions, **options)
    protocol_options = {"judge": args.judge} if args.protocol == "judge" else {}

    rollout = crl_trl.CRLRollout(args.protocol, pool, train, learner=args.learner, protocol_options=protocol_options,
                                 turns_per_episode=args.turns, seed=args.seed)
    vllm = dict(use_vllm=True, vllm_mode="server", vllm_server_port=args.vllm_server_port) if args.use_vllm else {}
    config = rollout.grpo_config(os.path.join(args.out, "trl"), num_generations=args.generations,
                                 questions_per_step=args.questions, max_steps=args.steps, learning_rate=args.lr,
                                 max_completion_length=args.max_new_tokens, seed=args.seed, **vllm)
    peft = None
    if args.lora:
        from peft import LoraConfig

        peft = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = rollout.grpo_trainer(config, peft_config=peft)
    main_process = trainer.accelerator.is_main_process
    results = {}
    if main_process:
        before = rollout.evaluate(trainer, held_out, max_new_tokens=args.max_new_tokens)
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    trl_seconds, trl_cpu = time.perf_counter() - t0, time.process_time() - c0  # CPU time: less hostage to a busy machine
    if not main_process:
        return
    after = rollout.evaluate(trainer, held_out, max_new_tokens=args.max_new_tokens)
    improvement = trainers.compare(before, after)
    print(f"TRL GRPOTrainer + CRLRollout, {args.steps} steps ({trl_seconds:.0f} s wall, {trl_cpu:.0f} s CPU of this "
          f"process, {rollout.rollouts} episodes):")
    print(improvement)
    results["trl"] = {**improvement.to_dict(), "seconds": trl_seconds, "cpu_seconds": trl_cpu, "episodes": rollout.rollouts}

    if args.compare_crl:
        crl_config = trainers.CRLConfig(steps=args.steps, questions_per_step=args.questions,
                                        num_generations=args.generations, learning_rate=args.lr,
                                        max_new_tokens=args.max_new_tokens, protocol_options=protocol_options,
                                        seed=args.seed, progress=False)
        crl = trainers.CRLTrainer(args.protocol, pool, train, learner=args.learner, config=crl_config,
                                  eval_task=held_out)
        t0, c0 = time.perf_counter(), time.process_time()
        crl.fit()
        crl_seconds, crl_cpu = time.perf_counter() - t0, time.process_time() - c0
        crl_improvement = trainers.compare(before, crl.evaluate())
        print(f"CRLTrainer, {args.steps} steps ({crl_seconds:.0f} s wall, {crl_cpu:.0f} s CPU, {crl.rollouts} episodes):")
        print(crl_improvement)
        results["crl"] = {**crl_improvement.to_dict(), "seconds": crl_seconds, "cpu_seconds": crl_cpu,
                          "episodes": crl.rollouts}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), **results}, f, indent=1)


if __name__ == "__main__":
    main()
