"""C-RL at scale on TRL: a ``GRPOTrainer`` rollout function that plays the protocol.

TRL's ``GRPOTrainer`` calls ``rollout_func(prompts, trainer)`` instead of generating (TRL >= 0.28;
pinned range in ``pyproject.toml``, extra ``crl-envs[trl]``). :class:`CRLRollout` is that function: each
prompt row is one task question; the rows of a question are played as episodes of the protocol
through :func:`trainers.rollout.rollout_episodes` (the one runner, :func:`crl_envs.run_episodes`), with the
trainer's *current* model as the learner's policy and every other agent from the pool (zoo/HF locally,
``vllm:`` / ``openai:`` servers at scale). It returns the learner's turns as completions and the
episode's score as a reward field that :func:`system_reward` hands to TRL. TRL then does the rest:
group advantages, its ``grpo`` / ``dapo`` / ``dr_grpo`` loss, accelerate (DDP, FSDP, DeepSpeed), LoRA
through ``peft_config``, and its vLLM weight sync.

The same maths as :class:`trainers.CRLTrainer` (tested in ``tests/test_trl.py``): with
``scale_rewards="none"`` TRL's advantage is ``r - mean(group)``, our ``group_mean``; its losses over
the learner's tokens equal ours for each ``loss_type`` both have; the learner's tokens are the only
completion tokens, so partners' tokens get no gradient; and a step plays G system episodes per question.

Layout: **one completion row per learner turn**, carrying its episode's reward. TRL groups
``num_generations`` consecutive rows of a question, so with ``turns_per_episode = K`` learner turns per
episode set ``GRPOConfig(num_generations = G * K)``: the rollout plays G episodes per question and the
group mean over the G*K rows is the mean over the G episodes (each counted K times), so advantages,
and the per-turn ``grpo`` / ``dr_grpo`` normalisations, are exactly :class:`~trainers.CRLTrainer`'s (a
*sequence* there is one learner turn too). An episode in which the learner speaks fewer than K times is
padded with masked rows (``env_mask`` 0: no gradient); more than K raises. One row per episode with
``env_mask`` over the partners' tokens in between would need every later prompt of the learner to
extend its earlier prompt + answer token by token, which the protocols' prompts do not (each phase
is a fresh chat).

Baselines through the same path (``reward=``): ``"standalone"`` (the learner answers alone: GRPO on its
own correctness, :func:`standalone_reward`) and ``"loo"`` (system score minus v(N∖{i}), the coalition
without the learner played once per question and call, :func:`loo_reward`). TRL always subtracts the
group mean, so under TRL the LOO reward gives exactly C-RL's advantages (the counterfactual is
constant within a group), at the cost of the extra episodes. Each is the learner's credit object
(:mod:`crl_envs.valuation.credit`, :attr:`CRLRollout.credit`), the native trainers' and the seat's: its
coalition, its counterfactuals and the reward an episode earns from their values.

**One learner per TRL trainer.** ``GRPOTrainer`` owns one model, one optimizer and one set of
completions per prompt, so :class:`CRLRollout` carries exactly one learner: its rows are that model's
turns, and every other pool member plays as a fixed partner. Several learners trained together (each
with its own credit, baseline, optimizer and checkpoint, from the same episodes, ``"joint"`` or
``"round_robin"``) are :class:`trainers.CRLTrainer` with ``learners=[...]``. k ``GRPOTrainer`` runs side
by side would each see the others at their starting weights (their updates never reach each other's
rollouts), which is not joint training.

Example (CPU, the zoo; ``examples/crl_trl.py`` also gives the multi-GPU + vLLM command)::

    rollout = CRLRollout("judge", agents.pool("zoo"), train, learner="model_4",  # a candidate and the judge:
                         protocol_options={"judge": "model_4"}, turns_per_episode=2)  # two turns per episode
    trainer = rollout.grpo_trainer(rollout.grpo_config("runs/trl", num_generations=8, ...))
    trainer.train()
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from agents import Agent, Generation, Pool, Request, SamplingParams, stable_hash
from agents import pool as make_pool
from crl_envs import protocols
from crl_envs import tasks as task_registry
from crl_envs.runner import Episode
from crl_envs.tasks import Task
from crl_envs.valuation.credit import credit
from crl_kit.errors import ConfigError, ConfigTypeError, MissingDependencyError
from trainers.evaluation import EvalResult, evaluate_policy
from trainers.rollout import learner_sequences, rollout_episodes

#: TRL versions this module is tested with (``pyproject.toml``'s ``trl`` extra).
TRL_VERSIONS = (">=1.16", "<1.17")
#: The credits a rollout takes (``reward=``; :mod:`crl_envs.valuation.credit`): those whose learner plays one
#: coalition, a row's reward being its episode's. Each returns its reward in this field, read by its function.
REWARD_FIELDS = {"system": "system_score", "standalone": "standalone_score", "loo": "loo_reward"}
REWARDS = tuple(REWARD_FIELDS)


def _import_trl():
    try:
        import trl
    except ImportError as e:
        raise MissingDependencyError("trainers.trl needs TRL: pip install 'crl-envs[trl]'") from e
    from packaging.version import Version

    if Version(trl.__version__) < Version("0.28"):
        raise MissingDependencyError(f"trainers.trl needs TRL >= 0.28 (rollout_func(prompts, trainer)); found {trl.__version__}: "
                          "pip install 'crl-envs[trl]'")
    return trl


# ---------------------------------------------------------------------- reward functions
def _field(name: str, values: Any, rollout: str) -> list[float]:
    if values is None:
        raise ConfigError(f"this reward function reads {name!r}, which the rollout did not return; build the rollout "
                         f"with CRLRollout(..., reward={rollout!r})")
    return [float(v) for v in values]


def system_reward(completions: list, system_score: list[float] | None = None, **_: Any) -> list[float]:
    """C-RL's reward: the score of the system's final answer in the episode the row's turn belongs to."""
    return _field("system_score", system_score, "system")


def standalone_reward(completions: list, standalone_score: list[float] | None = None, **_: Any) -> list[float]:
    """GRPO's reward: the learner's own correctness, answering alone (``CRLRollout(reward="standalone")``)."""
    return _field("standalone_score", standalone_score, "standalone")


def loo_reward(completions: list, loo_reward: list[float] | None = None, **_: Any) -> list[float]:
    """The explicit leave-one-out reward ``system score - v(N \\ {i})`` (``CRLRollout(reward="loo")``)."""
    return _field("loo_reward", loo_reward, "loo")


REWARD_FUNCTIONS = {"system": system_reward, "standalone": standalone_reward, "loo": loo_reward}


def grpo_config(output_dir: str, *, num_generations: int = 8, questions_per_step: int = 8, turns_per_episode: int = 1,
                **overrides: Any):
    """A ``trl.GRPOConfig`` with C-RL's conventions, for :class:`CRLRollout`.

    ``num_generations`` is G, system episodes per question; TRL's own ``num_generations`` becomes
    ``G * turns_per_episode`` (one row per learner turn). One optimizer step plays ``questions_per_step``
    questions over all processes (``per_device_train_batch_size`` = rows per process). Set:
    ``scale_rewards="none"`` (C-RL's group-mean advantage), ``loss_type="dapo"``, ``beta=0``, no dropout,
    constant learning rate without warm-up, ``shuffle_dataset`` and no TRL checkpoints unless
    overridden. Every other ``trl.GRPOConfig`` field can be given in ``overrides``.
    """
    trl = _import_trl()
    for name, value in (("num_generations", num_generations), ("questions_per_step", questions_per_step),
                        ("turns_per_episode", turns_per_episode)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"grpo_config: {name} must be an int >= 1, got {value!r}")
    if num_generations < 2:
        raise ConfigError("grpo_config: num_generations (G) must be >= 2: a group baseline needs 2 episodes per question")
    rows = questions_per_step * num_generations * turns_per_episode
    device = {k: overrides[k] for k in ("use_cpu", "bf16") if k in overrides}
    device = {"use_cpu": not torch.cuda.is_available(), "bf16": torch.cuda.is_available(), **device}
    processes = trl.GRPOConfig(output_dir=output_dir, report_to=[], **device).world_size  # as the trainer will see it
    if rows % processes:
        raise ConfigError(f"grpo_config: {questions_per_step} questions x G={num_generations} x {turns_per_episode} "
                         f"turns = {rows} rows do not split over {processes} processes; change questions_per_step")
    settings = dict(
        num_generations=num_generations * turns_per_episode, per_device_train_batch_size=rows // processes,
        gradient_accumulation_steps=1, scale_rewards="none", loss_type="dapo", beta=0.0, disable_dropout=True,
        lr_scheduler_type="constant", warmup_steps=0, max_completion_length=256, temperature=1.0, top_p=1.0,
        save_strategy="no", report_to=[], logging_steps=1, use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
    )
    settings.update(overrides)
    return trl.GRPOConfig(output_dir=output_dir, **settings)


def mask_relative_positions(model: torch.nn.Module):
    """Make ``model``'s forward count positions from each row's first real token when the caller passes an
    ``attention_mask`` but no ``position_ids``, as ``generate`` does. TRL's GRPO log-prob forward passes no
    ``position_ids`` with left-padded prompts; models with absolute position embeddings (GPT-2, the zoo)
    then score padded rows at shifted positions (about 7 nats off on a zoo logit here; TRL fixed the
    same in its online-DPO trainers, huggingface/trl#6800). With RoPE it changes nothing. Returns the hook handle."""
    inner = getattr(model, "base_model", model)  # the decoder stack: the LM head calls it through __call__

    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if kwargs.get("position_ids") is not None or not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            return None
        ids = args[0] if args else kwargs.get("input_ids")
        length = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
        kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]
        return args, kwargs

    return inner.register_forward_pre_hook(hook, with_kwargs=True)


# ---------------------------------------------------------------------- the learner on TRL's vLLM server
class TRLVLLMServerAgent(Agent):
    """The learner served by ``trl vllm-serve``: TRL pushes the trained weights to the server before every
    rollout call, and this agent asks it for the learner's turns (token ids and log-probs), rendering chats
    like ``like`` (the learner's :class:`agents.HFAgent`). Requests are not seeded (the server samples
    freely), so rollouts are not reproducible in this mode."""

    def __init__(self, client: Any, like: Agent, *, eos_ids: set[int]):
        self.client, self.like, self.name, self.eos_ids = client, like, like.name, set(eos_ids)
        self.tokenizer = like.tokenizer

    def _generate(self, requests: list[Request]) -> list[Generation]:
        groups: dict[tuple, list[int]] = OrderedDict()
        for i, r in enumerate(requests):
            s = r.sampling
            groups.setdefault((s.temperature, s.top_p, s.max_new_tokens, s.stop), []).append(i)
        out: list[Generation | None] = [None] * len(requests)
        for (temperature, top_p, max_new_tokens, stop), members in groups.items():
            prompts = [self.like.encode_prompt(requests[i].messages) for i in members]
            t0 = time.perf_counter()
            result = self.client.generate(prompts=prompts, n=1, temperature=temperature, top_p=top_p,
                                          max_tokens=max_new_tokens, logprobs=0,
                                          generation_kwargs={"stop": list(stop)} if stop else None)
            seconds = (time.perf_counter() - t0) / len(members)
            for i, ids, prompt, lps in zip(members, result["completion_ids"], prompts, result["logprobs"]):
                ids, lps = list(ids), [lp[0] for lp in lps]
                reason = "length" if len(ids) >= max_new_tokens else "stop"
                if ids and ids[-1] in self.eos_ids:  # our convention: the stop token is not part of the answer
                    ids, lps, reason = ids[:-1], lps[:-1], "stop"
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                out[i] = Generation(text, ids, lps, reason, len(prompt), len(ids), prompt, seconds)
        return out  # type: ignore[return-value]


# ---------------------------------------------------------------------- the rollout function
class CRLRollout:
    """``rollout_func`` for ``trl.GRPOTrainer``: plays ``protocol`` for every prompt row.

    Args:
        protocol: a protocol factory or name (``crl_envs.judge_v0``, ``"judge"``).
        pool: the models; ``pool[learner]`` must be an :class:`agents.HFAgent` (its tokenizer and chat
            rendering are the learner's; its model is replaced by the trainer's current one).
        task: the training questions (a Task or a name); :meth:`dataset` is TRL's ``train_dataset``.
        learner: the agent id trained.
        reward: ``"system"`` (C-RL), ``"standalone"`` (the learner alone) or ``"loo"`` (system score minus
            v(N∖{i})); pick the matching reward function from :data:`REWARD_FUNCTIONS` (:meth:`grpo_trainer` does).
        protocol_options: keyword arguments of the protocol factory (``{"judge": "model_4"}``).
        partner_temperature: the other agents' sampling (0: greedy, as :class:`~trainers.TrainerConfig`).
        partner_max_new_tokens: their token budget (default: TRL's ``max_completion_length``).
        turns_per_episode: K, the learner's turns per episode (TRL's ``num_generations`` = G * K).
        seed: seeds the episodes (with the trainer's step and process index).

    The learner samples with the trainer's ``temperature``, ``top_p`` and ``max_completion_length``.
    ``calls`` records each call (step, process, questions, episodes played) and ``episodes`` the episodes
    of the latest call, row by row (``episodes[row_episode[i]]`` is row i's episode).
    """

    def __init__(self, protocol: Any, pool: Pool | Sequence[Agent | str] | str, task: Task | str, learner: str = "model_0",
                 *, reward: str = "system", protocol_options: dict[str, Any] | None = None,
                 partner_temperature: float = 0.0, partner_max_new_tokens: int | None = None,
                 turns_per_episode: int = 1, seed: int = 0):
        self.protocol = protocols.get(protocol)
        self.pool = pool if isinstance(pool, Pool) else make_pool(pool)
        self.task = task_registry.load(task, split="train") if isinstance(task, str) else task
        if learner not in self.pool.ids:
            raise ConfigError(f"learner {learner!r} is not in the pool; pool agents are {self.pool.ids}")
        if reward not in REWARDS:
            raise ConfigError(f"reward must be one of {REWARDS}, got {reward!r}")
        #: the learner's credit (:mod:`crl_envs.valuation.credit`) and the one coalition its episodes play
        self.credit = credit(reward)
        (self._own,) = self.credit.coalitions(self.pool.ids, learner)
        if isinstance(turns_per_episode, bool) or not isinstance(turns_per_episode, int) or turns_per_episode < 1:
            raise ConfigError(f"turns_per_episode must be an int >= 1, got {turns_per_episode!r}")
        source = self.pool[learner]
        for attr in ("model", "tokenizer", "encode_prompt"):
            if not hasattr(source, attr):
                raise ConfigTypeError(f"learner {learner!r} is a {type(source).__name__}, which exposes no {attr!r}: TRL trains a "
                                "transformers model; make the learner an agents.HFAgent (spec 'hf:<path>')")
        self.learner, self.reward, self.turns_per_episode, self.seed = learner, reward, turns_per_episode, seed
        self.reward_field = REWARD_FIELDS[reward]
        self.protocol_options = dict(protocol_options or {})
        self.protocol(self.pool, self.task, **self.protocol_options)  # bad options fail here, not in the first step
        self.partner_sampling = SamplingParams(temperature=partner_temperature, max_new_tokens=partner_max_new_tokens or 1)
        self._partner_max_new_tokens = partner_max_new_tokens
        self.question_of: dict[str, str] = {}  # prompt text -> example id
        for ex in self.task:
            known = self.question_of.setdefault(ex.question, ex.id)
            if known != ex.id and self.task.by_id(known).answer != ex.answer:
                raise ConfigError(f"examples {known!r} and {ex.id!r} ask the same question with different answers; "
                                 "the rollout identifies a question by its text: drop one of them")
        self.calls: list[dict[str, Any]] = []
        self.episodes: list[Episode] = []
        self.row_episode: list[int] = []
        self.rollouts = 0
        self._client = None

    # ------------------------------------------------------------------ what TRL needs
    def dataset(self):
        """TRL's ``train_dataset``: one row per distinct question, its text as the ``prompt``."""
        from datasets import Dataset

        return Dataset.from_dict({"prompt": list(self.question_of)})

    def learner_model(self) -> tuple[torch.nn.Module, Any]:
        """A copy of the learner's model (the pool's is never trained) and its tokenizer, for TRL's
        ``model`` and ``processing_class``."""
        source = self.pool[self.learner]
        return copy.deepcopy(source.model), source.tokenizer

    def grpo_config(self, output_dir: str, *, num_generations: int = 8, questions_per_step: int = 8, **overrides: Any):
        """:func:`grpo_config` with this rollout's ``turns_per_episode``."""
        return grpo_config(output_dir, num_generations=num_generations, questions_per_step=questions_per_step,
                           turns_per_episode=self.turns_per_episode, **overrides)

    def grpo_trainer(self, args: Any, *, model: Any = None, **kwargs: Any):
        """``trl.GRPOTrainer`` wired to this rollout: the learner's model (a copy, with
        :func:`mask_relative_positions`), its tokenizer, the reward function of ``reward``, :meth:`dataset`.
        ``kwargs`` go to ``GRPOTrainer`` (``peft_config``, ...)."""
        trl = _import_trl()
        default_model, tokenizer = self.learner_model()
        mask_relative_positions(default_model if model is None else model)
        kwargs.setdefault("reward_funcs", REWARD_FUNCTIONS[self.reward])
        kwargs.setdefault("train_dataset", self.dataset())
        kwargs.setdefault("processing_class", tokenizer)
        return trl.GRPOTrainer(model=model if model is not None else default_model, args=args, rollout_func=self, **kwargs)

    # ------------------------------------------------------------------ one call
    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        """Play every prompt row's question (G episodes each, the learner's credit's coalitions with them) and
        return one completion row per learner turn, each carrying its episode's reward."""
        rows_of = self._rows_of(prompts, trainer.num_generations)
        mode = "train" if trainer.model.training else "eval"
        step, rank = trainer.state.global_step, trainer.accelerator.process_index
        by_count: OrderedDict[int, list[str]] = OrderedDict()  # one runner call per distinct episode count
        for example, rows in rows_of.items():
            by_count.setdefault(len(rows) // self.turns_per_episode, []).append(example)
        episodes_of: dict[str, list[Episode]] = {}
        values_of: dict[str, dict[tuple[str, ...], float]] = {}  # example -> each counterfactual's value
        played = 0
        with self._learner_policy(trainer) as policy:
            for samples, examples in by_count.items():
                common = dict(examples=examples, seed=stable_hash(self.seed, "trl", mode, step, rank, samples) % (2**31),
                              **self._sampling(trainer.args))
                eps = self._play(policy, self._own.members, samples=samples, protocol=self.credit.protocol, **common)
                played += len(eps)
                for e, example in enumerate(examples):
                    episodes_of[example] = eps[e * samples : (e + 1) * samples]
                    values_of.setdefault(example, {})
                for without in self.credit.counterfactuals([self._own]):
                    played += self._value(policy, without, values_of, **common)
        out = self._rows(rows_of, episodes_of, values_of, trainer.processing_class)
        self.rollouts += played
        self.calls.append({"step": step, "mode": mode, "process": rank, "questions": list(rows_of),
                           "rows": [len(r) for r in rows_of.values()],
                           "episodes": len(self.episodes), "played": played})
        return out

    def _rows_of(self, prompts: list, num_generations: int) -> OrderedDict[str, list[int]]:
        """Example id -> its prompt rows, checked: each row a question of the task, K rows per episode."""
        k = self.turns_per_episode
        if num_generations % k:
            raise ConfigError(f"GRPOConfig.num_generations={num_generations} is not G x turns_per_episode "
                             f"(turns_per_episode={k}); use trainers.trl.grpo_config(num_generations=G, turns_per_episode={k})")
        rows_of: OrderedDict[str, list[int]] = OrderedDict()
        for row, prompt in enumerate(prompts):
            text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
            if text not in self.question_of:
                raise ConfigError(f"prompt row {row} is not a question of the rollout's task; use CRLRollout.dataset() "
                                 "as the trainer's train_dataset")
            rows_of.setdefault(self.question_of[text], []).append(row)
        for example, rows in rows_of.items():
            if len(rows) % k:
                raise ConfigError(f"this process got {len(rows)} rows of question {example!r}, not a multiple of "
                                 f"turns_per_episode={k}; make per_device_train_batch_size a multiple of num_generations")
        return rows_of

    def _sampling(self, args: Any) -> dict[str, SamplingParams]:
        """The learner's sampling (the trainer's temperature, top-p, completion length) and the partners'."""
        return {"learner_sampling": SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                                   max_new_tokens=args.max_completion_length),
                "partner_sampling": SamplingParams(temperature=self.partner_sampling.temperature,
                                                   max_new_tokens=self._partner_max_new_tokens or args.max_completion_length)}

    def _play(self, policy: Agent, members: Sequence[str], *, protocol: str | None = None, **common: Any) -> list[Episode]:
        """Episodes of ``members`` (everyone: the protocol's own coalition) under ``protocol`` (default: the rollout's)."""
        coalition = None if set(members) == set(self.pool.ids) else list(members)
        if protocol is not None:
            return rollout_episodes(protocol, self.pool, self.task, self.learner, policy, coalition=coalition, **common)
        return rollout_episodes(self.protocol, self.pool, self.task, self.learner, policy, coalition=coalition,
                                options=self.protocol_options, **common)

    def _value(self, policy: Agent, members: tuple[str, ...], values_of: dict, *, examples: list[str], **common: Any) -> int:
        """Each example's value of the counterfactual ``members`` (the mean of the credit's samples; the empty
        coalition: the protocol's ``v(∅)``) into ``values_of``; returns the episodes played."""
        if not members:
            empty = float(self.protocol(self.pool, self.task, **self.protocol_options).empty_value)
            for example in examples:
                values_of[example][members] = empty
            return 0
        eps = self._play(policy, members, examples=examples, **{**common, "samples": self.credit.samples})
        per = self.credit.samples
        for e, example in enumerate(examples):
            values_of[example][members] = sum(ep.score for ep in eps[e * per : (e + 1) * per]) / per
        return len(eps)

    def _rows(self, rows_of: OrderedDict[str, list[int]], episodes_of: dict[str, list[Episode]],
              values_of: dict[str, dict], tokenizer: Any) -> dict[str, list]:
        """TRL's rows: one per learner turn of each episode (padded with masked rows to K), each with its
        episode's reward (:meth:`~crl_envs.valuation.credit.Credit.reward`) under :attr:`reward_field`."""
        k, n = self.turns_per_episode, sum(len(rows) for rows in rows_of.values())
        eos = tokenizer.eos_token_id if isinstance(tokenizer.eos_token_id, int) else None
        out: dict[str, list] = {key: [None] * n for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                            "example_id", "episode_score", self.reward_field)}
        self.episodes, self.row_episode = [], [0] * n
        for example, rows in rows_of.items():
            cursor = iter(rows)
            for ep in episodes_of[example]:
                self.episodes.append(ep)
                turns = learner_sequences([ep], self.learner, [0.0], eos_token_id=eos)
                if len(turns) > k:
                    raise ConfigError(f"the learner spoke {len(turns)} times in an episode of {example!r}, more than "
                                     f"turns_per_episode={k}; raise turns_per_episode (and num_generations with it)")
                reward = self.credit.reward([self._own], {self._own.members: ep.score, **values_of[example]})
                pad = [eos if eos is not None else tokenizer.pad_token_id]
                for t in range(k):
                    row = next(cursor)
                    seq = turns[t] if t < len(turns) else None  # fewer than K turns: a masked row keeps the group's shape
                    out["prompt_ids"][row], out["completion_ids"][row] = (seq.prompt_ids, seq.completion_ids) if seq else (pad, pad)
                    out["logprobs"][row] = seq.logprobs if seq else [0.0]
                    out["env_mask"][row] = [1] * len(seq.completion_ids) if seq else [0]
                    out["example_id"][row], out["episode_score"][row], out[self.reward_field][row] = example, ep.score, reward
                    self.row_episode[row] = len(self.episodes) - 1
        return out

    @contextlib.contextmanager
    def _learner_policy(self, trainer: Any) -> Iterator[Agent]:
        """The learner's :class:`~agents.Agent` for one call: the trainer's current model inside a copy of
        the pool's HFAgent (same tokenizer, chat rendering, stop ids, batched decoding), or TRL's vLLM server."""
        like = self.pool[self.learner]
        if getattr(trainer, "use_vllm", False):
            generation = trainer.vllm_generation
            if generation.mode != "server":
                raise ConfigError("CRLRollout with use_vllm supports vllm_mode='server' (trl vllm-serve) only; "
                                 "set vllm_mode='server', or use_vllm=False")
            if self._client is None:
                client = getattr(generation, "vllm_client", None)
                if client is None:  # only the main process holds TRL's client; generation requests need no communicator
                    from trl.generation.vllm_client import VLLMClient

                    url = generation.server_base_url or f"http://{generation.server_host}:{generation.server_port}"
                    client = VLLMClient(base_url=url, connection_timeout=generation.server_timeout)
                self._client = client
            yield TRLVLLMServerAgent(self._client, like, eos_ids=set(trainer.eos_token_ids))
            return
        from trl.models import unwrap_model_for_generation

        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gather_deepspeed3_params=trainer.args.ds3_gather_for_generation) as model:
            policy = copy.copy(like)
            policy.model, policy.device = model, trainer.accelerator.device
            was_training = model.training
            model.eval()
            try:
                yield policy
            finally:
                model.train(was_training)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, model: Any, task: Task | str, *, max_new_tokens: int = 256) -> EvalResult:
        """System and standalone accuracy with ``model`` (a trainer's model, or a ``GRPOTrainer``) as the
        learner, greedy, on held-out questions: :func:`trainers.evaluate_policy`, as our trainers'."""
        if hasattr(model, "accelerator"):  # a GRPOTrainer
            model = model.accelerator.unwrap_model(model.model)
        task = task_registry.load(task) if isinstance(task, str) else task
        policy = copy.copy(self.pool[self.learner])
        policy.model = model
        was_training = model.training
        model.eval()
        try:
            return evaluate_policy(self.protocol, self.pool, task, self.learner, policy, max_new_tokens=max_new_tokens,
                                   protocol_options=self.protocol_options, seed=self.seed)
        finally:
            model.train(was_training)
