"""TRL's ``environment_factory``: a collaboration protocol as the environment of ``trl.GRPOTrainer``.

``GRPOTrainer(environment_factory=F)`` builds one instance of ``F()`` per rollout and calls
``reset(**row)`` before generating; the string it returns is appended to the row's last user message.
The instance's public methods are the model's tools, and reward functions receive ``environments=``.
Here (TRL 1.16, its ``environment_factory`` needs transformers >= 5.2):

- :meth:`CollaborationEnvironment.reset` plays the partners up to the learner's first turn through the
  library's runner (:class:`~crl_envs.integrations.seat.LearnerSeat`) and returns what the learner sees.
- Without tools (any model), the completion is the learner's turn: :func:`seat_reward` hands it to the
  episode, which the partners finish, and returns the learner's reward. A protocol that asks the learner
  for more than one turn needs tools: ``tools=True`` adds :meth:`ToolCollaborationEnvironment.say`, the
  learner's message for its current turn, returning what the partners said before its next turn; the
  completion's final answer is the learner's last turn (in place of the last ``say`` if those used every turn).
- The reward is the seat's: the system's score (C-RL), LOO or Shapley credit (``reward=``).

Example (CPU, the zoo; ``docs/integrations.md`` runs it)::

    factory = EnvironmentFactory("vote", agents.pool("zoo"), task, learner="model_4")
    trainer = trl.GRPOTrainer(model=..., args=..., train_dataset=factory.dataset(),
                              environment_factory=factory, reward_funcs=seat_reward)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents import Pool, SamplingParams, ScriptedAgent
from crl_envs.integrations.seat import LearnerSeat, SeatGame, render
from crl_envs.runner import RequestMemo, run_episodes
from crl_envs.tasks import Task
from crl_kit.errors import ConfigError, RunError

#: What :meth:`ToolCollaborationEnvironment.say` returns once the episode is over.
EPISODE_OVER = "The discussion is over; give your final answer."


class CollaborationEnvironment:
    """One rollout's seat in the protocol (no tools: the completion is the learner's one turn)."""

    def __init__(self, game: SeatGame):
        self._seat = LearnerSeat(game)

    def reset(self, **row: Any) -> str | None:
        """Start the row's episode; the learner's context, appended to the prompt's last user message."""
        context = self._seat.reset(self._seat.game.example(row))
        return None if context is None else render(context)

    def _finish(self, completion: Any) -> float:
        """The completion's last assistant text as the learner's pending turn; the partners finish the episode."""
        seat = self._seat
        if seat.context is not None:
            text = final_text(completion)
            if seat.say(text) is not None:
                self._more(text)
        return float(seat.reward)

    def _more(self, text: str) -> None:
        seat = self._seat
        seat.close()
        raise ConfigError(f"{seat.game.name} asked learner {seat.game.learner!r} for another turn after its completion; "
                          "a model without tools plays one turn: use EnvironmentFactory(..., tools=True) with a "
                          "tool-calling model")


class ToolCollaborationEnvironment(CollaborationEnvironment):
    """A seat with one tool, :meth:`say`, for multi-turn protocols (tool-calling models).

    The model's final answer (its completion's last message, not a tool call) is always its last turn: when
    its ``say`` calls used every turn, the episode is played again with the final answer in place of the last
    one (the partners' requests are the same up to there; a :class:`~crl_envs.runner.RequestMemo` reuses them)."""

    def __init__(self, game: SeatGame):
        super().__init__(game)
        self._said: list[str] = []  # the messages say() carried into this episode

    def reset(self, **row: Any) -> str | None:
        self._said = []
        return super().reset(**row)

    def say(self, message: str) -> str:
        """Say your message to the other models in the discussion and read what they answer.

        Args:
            message: your contribution for this turn (your reasoning and answer).

        Returns:
            What the others said before your next turn, or a note that the discussion is over.
        """
        if self._seat.context is None:
            return EPISODE_OVER
        context = self._seat.say(message)
        self._said.append(message)
        return EPISODE_OVER if context is None else render(context)

    def _finish(self, completion: Any) -> float:
        seat = self._seat
        if seat.context is None and self._said and answers_last(completion):
            final = final_text(completion)
            if final == self._said[-1]:
                return float(seat.reward)  # the final answer is the turn already said
            context = seat.reset(seat.example)  # say() used the last turn: play again up to it
            for text in self._said[:-1]:
                context = seat.say(text) if context is not None else None
            if context is None:
                raise RunError(f"{seat.game.name} ended before learner {seat.game.learner!r}'s last turn when "
                               "replayed with the same messages: its partners do not answer the same requests "
                               "alike, so the final answer cannot replace the last say()")
        return super()._finish(completion)

    def _more(self, text: str) -> None:
        """Turns left after the model's final answer: it says that answer again until the episode ends."""
        while self._seat.say(text) is not None:
            pass


def answers_last(completion: Any) -> bool:
    """Whether a TRL completion ends with an answer: a string, or a last message from the assistant without tool
    calls (a completion cut off mid tool loop ends with a call or its result)."""
    if isinstance(completion, str):
        return True
    messages = list(completion)
    return bool(messages) and messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls")


def final_text(completion: Any) -> str:
    """The learner's message in a TRL completion: the text, or the content of its last assistant message."""
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    return ""


def seat_reward(completions: list, environments: Sequence[CollaborationEnvironment] | None = None,
                **_: Any) -> list[float]:
    """The reward function of :class:`EnvironmentFactory`'s environments: each completion finishes its
    rollout's episode, and the learner's reward (system score, LOO or Shapley credit) comes back."""
    if environments is None:
        raise ConfigError("seat_reward needs GRPOTrainer(environment_factory=EnvironmentFactory(...)): it read no "
                          "environments")
    if len(completions) != len(environments):
        raise ConfigError(f"seat_reward got {len(completions)} completions for {len(environments)} environments: "
                          "give one environment per completion (GRPOTrainer's environment_factory does)")
    return [env._finish(c) if isinstance(env, CollaborationEnvironment) else None
            for c, env in zip(completions, environments)]


class EnvironmentFactory:
    """``environment_factory`` for ``trl.GRPOTrainer``: a new seat of ``learner`` in ``protocol`` per call.

    Args:
        protocol, pool, task, learner, reward, options, partner_sampling, seed, memo: the seat's game
            (:class:`~crl_envs.integrations.seat.SeatGame`): ``reward`` is ``"system"``, ``"loo"`` or ``"shapley"``.
        tools: ``True`` gives the learner the :meth:`~ToolCollaborationEnvironment.say` tool, for
            protocols where it speaks more than once (a tool-calling model and chat template); ``False``
            (default) checks that the learner speaks once per episode (played with stand-ins).
        name: the value of the dataset's ``environment`` column when factories are mixed in a dict.
        tokenizer: the learner's tokenizer; with ``tools=True`` its chat template must render tool calls
            (checked here, with TRL's own test, rather than when the trainer starts).
    """

    def __init__(self, protocol: Any, pool: Pool | Sequence[Any] | str, task: Task | str, learner: str, *,
                 reward: str = "system", options: Mapping[str, Any] | None = None, tools: bool = False,
                 partner_sampling: SamplingParams | None = None, seed: int = 0, memo: RequestMemo | None = None,
                 name: str | None = None, tokenizer: Any = None):
        self.game = SeatGame(protocol, pool, task, learner, reward=reward, options=options,
                             partner_sampling=partner_sampling, seed=seed, memo=memo)
        self.tools, self.name = bool(tools), name or self.game.name
        if self.tools and tokenizer is not None:
            from trl.chat_template_utils import supports_tool_calling

            if not supports_tool_calling(tokenizer):
                raise ConfigError(f"tools=True, but the chat template of {type(tokenizer).__name__} "
                                  f"{getattr(tokenizer, 'name_or_path', '')!r} does not render tool calls: use a "
                                  "tool-calling model, or tools=False with a protocol where the learner speaks once")
        if not self.tools:
            turns = learner_turns(self.game)
            if turns > 1:
                raise ConfigError(f"{self.game.name} asks learner {learner!r} for {turns} turns per episode; a model "
                                  "without tools plays one: pass tools=True with a tool-calling model")

    def __call__(self) -> CollaborationEnvironment:
        return (ToolCollaborationEnvironment if self.tools else CollaborationEnvironment)(self.game)

    def dataset(self, environment: bool = False):
        """TRL's ``train_dataset``: one row per question, an empty user prompt (``reset`` fills it), the
        ``example_id`` that ``reset`` reads, and with ``environment=True`` the ``environment`` column that
        routes a row when factories are mixed in a dict."""
        from datasets import Dataset

        rows = self.game.dataset_rows()
        rows["prompt"] = [[{"role": "user", "content": ""}] for _ in rows["example_id"]]
        if environment:
            rows["environment"] = [self.name] * len(rows["example_id"])
        return Dataset.from_dict(rows)


def learner_turns(game: SeatGame) -> int:
    """The learner's turns in one episode on the task's first question, every model a stand-in that answers
    at once (the count is the protocol's shape, not the models')."""
    stand_ins = Pool([ScriptedAgent(a.name, lambda example, messages: "The answer is 0. Confidence: 9")
                      for a in game.pool.values()])
    episode = run_episodes(game.factory, stand_ins, game.task, examples=[0], options=game.options, progress=False,
                           sampling=SamplingParams(temperature=0.0, max_new_tokens=1))[0]
    return len(episode.turns_of(game.learner))


_LOOP_END = "{% endif %}{% endfor %}"
_TOOL_TURNS = ("{% elif m['role'] == 'tool' %}<tool>{{ m['content'] }}{% endif %}"
               "{% if m.get('tool_calls') %}<tool_call>{{ m['tool_calls'] | tojson }}</tool_call>{% endif %}{% endfor %}")


def with_tool_turns(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` whose chat template (one loop over the messages, such as the zoo's) also renders
    tool calls and tool results; user and assistant messages render as before. TRL requires a template that
    renders tool turns of every ``environment_factory`` model, even one that never calls a tool."""
    import copy

    template = tokenizer.chat_template
    if not isinstance(template, str) or template.count(_LOOP_END) != 1:
        raise ConfigError("with_tool_turns adds tool turns to a template that ends its message loop with "
                          "'{% endif %}{% endfor %}' once; give this tokenizer a chat template that renders tool calls")
    out = copy.deepcopy(tokenizer)
    out.chat_template = template.replace(_LOOP_END, _TOOL_TURNS)
    return out
