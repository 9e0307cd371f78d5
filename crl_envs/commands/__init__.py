"""The ``crl-envs`` command line: the interface layer, every subcommand in this package
(``play`` here, ``value`` in :mod:`crl_envs.commands.value`, ``study`` in :mod:`crl_envs.commands.study`).

Subcommands register themselves in :data:`SUBCOMMANDS` (``name -> (add_arguments, run, help)``).
Subcommands of other packages are listed in :data:`PLUGINS` (``name -> (module, help)``); a plugin's
module is imported only when its subcommand is chosen, so ``crl-envs --help`` and a mistyped
command answer at once, without importing torch or transformers.

Errors a user can fix (the library's :class:`~crl_kit.errors.CrlEnvsError`: bad options, unknown names;
and ``OSError``: missing files, an unreachable hub, ...) print one line and exit with status 2;
``CRL_ENVS_TRACEBACK=1`` shows the full traceback instead. Any other exception is a bug: its traceback. Usage errors are one line too,
without the usage text, and a mistyped option names the closest one (:class:`CommandParser`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from crl_kit.errors import ConfigError, CrlEnvsError
from crl_kit.validation import close_match, did_you_mean

Subcommand = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]
SUBCOMMANDS: dict[str, Subcommand] = {}
#: Subcommands defined elsewhere: ``name -> (module that registers it in SUBCOMMANDS, help)``.
PLUGINS: dict[str, tuple[str, str]] = {
    "value": ("crl_envs.commands.value",
              "value a pool's models: individual vs LOO/Shapley/Banzhaf, table + JSON + PNG"),
    "study": ("crl_envs.commands.study", "run a study config: pools x protocols x tasks, trainers; prints the paper's tables"),
}
#: What a user can fix from the message alone, shown as one line (exit status 2): the library's errors
#: (:mod:`crl_kit.errors`) and the operating system's (a missing file, an unwritable directory, an
#: unreachable server). Anything else is a bug and shows its traceback.
USER_ERRORS = (CrlEnvsError, OSError)


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line naming the problem and where to look, instead of
    the whole usage text; a mistyped option gets the closest real one (``--temprature`` ->
    ``did you mean --temperature?``). Subcommand parsers inherit the class (``add_subparsers``)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        chosen = self._subcommand_parser(parsed) if extras else None
        if chosen is not None:  # what the chosen subcommand does not take: named with its options
            chosen.error_unknown(extras)
        return parsed, extras

    def _subcommand_parser(self, parsed: argparse.Namespace) -> CommandParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                return chosen if isinstance(chosen, CommandParser) else None
        return None

    def error_unknown(self, extras: Sequence[str]) -> None:
        """Exit with one line for arguments this parser does not take, suggesting a close option."""
        options = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        flags = [word for word in extras if word.startswith("-")]
        if not flags:
            self.error(f"unexpected argument {extras[0]!r}")
        word = flags[0].split("=", 1)[0]
        close = close_match(word, options)
        hint = f" (did you mean {close}?)" if close else ""
        self.error(f"unknown option {word}{hint}")

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        """One line on stderr, exit status 2 (argparse's own contract for usage errors)."""
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (``--max-new-tokens 0`` is refused, not read as the default)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def writable_dir(path: str, flag: str = "--out") -> None:
    """Raise ``OSError`` naming ``flag`` unless ``path`` is (or can be made) a directory this process can
    write into: checked before any expensive work."""
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise OSError(f"{flag} {path}: cannot write there ({e.strerror or e}); pass a writable directory") from None


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    """``--task-option KEY=VALUE`` (repeatable): options of ``crl_envs.tasks.load``."""
    p.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="task option, e.g. --task-option path=test.jsonl (GSM8K offline) or "
                        "--task-option digits=3 (repeatable)")


def _add_play(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", default="debate", help="protocol name (default: debate)")
    p.add_argument("--task", default="arith", help="task name (default: arith)")
    add_task_arguments(p)
    p.add_argument("--pool", default="zoo", help="'zoo', 'scripted', 'pretrained', or comma-separated agent specs")
    p.add_argument("--backend", choices=PLAY_BACKENDS, default="auto",
                   help="backend of --pool pretrained: hf, llamacpp, vllm; auto (default): hf (which backend is faster "
                        "depends on the machine: measure with benchmarks/cpu_backends.py, docs/real-models.md)")
    p.add_argument("--n", type=int, default=3, help="number of questions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help=f"answer length cap (default: what the task needs, e.g. arith {PLAY_MAX_NEW_TOKENS['arith']}; "
                        f"{DEFAULT_MAX_NEW_TOKENS} for tasks not listed)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="protocol option, e.g. --option rounds=3 (repeatable)")
    p.add_argument("--quiet", action="store_true", help="print only the scores")


PLAY_BACKENDS = ("auto", "hf", "llamacpp", "vllm")
#: ``play``'s answer length per task: room for a short reasoning and "The answer is N." (SmolLM2's arith
#: answers that end on their own take at most ~40 tokens), not 256 tokens of a base model repeating itself
PLAY_MAX_NEW_TOKENS = {"arith": 64, "gsm8k": 256, "mmlu": 64, "arc": 64, "gpqa": 64}
DEFAULT_MAX_NEW_TOKENS = 256


def play_backend(choice: str, n_questions: int = 3) -> str:
    """``--backend auto``: HFAgent, which loads in seconds and wins or ties on some CPUs. vLLM's CPU engine
    is faster on others and slower on some (``benchmarks/cpu_backends.py``: 2.54x HFAgent on vote on one 2-core
    machine, 0.81x on another), so no rule of thumb picks it without measuring the machine at hand: run that
    benchmark and pass ``--backend vllm`` where it wins (docs/real-models.md, "Which CPU backend to pick").
    llama.cpp is never picked: it is faster only one request at a time, and a protocol batches.
    ``n_questions`` is accepted for callers of the earlier rule and not used."""
    del n_questions
    return "hf" if choice == "auto" else choice


def build_pool(spec: str):
    """``zoo`` (the embedded models; the scripted pool while the zoo is not installed), ``scripted``
    (three deterministic experts of accuracy 0.8/0.6/0.4), or comma-separated agent specs."""
    import agents

    if spec == "scripted":
        return agents.pool([agents.ScriptedAgent.expert(f"expert-{a}", a) for a in (0.8, 0.6, 0.4)])
    if spec == "zoo":
        try:
            return agents.pool("zoo")
        except (KeyError, ValueError, FileNotFoundError, ImportError) as e:
            print(f"[crl-envs] zoo unavailable ({e}); using the scripted pool", file=sys.stderr)
            return build_pool("scripted")
    return agents.pool([s.strip() for s in spec.split(",") if s.strip()])


def parse_options(pairs: Sequence[str], flag: str = "--option") -> dict:
    """``["rounds=3", "path=a.jsonl"]`` -> ``{"rounds": 3, "path": "a.jsonl"}`` (values read as JSON
    where they parse, else kept as text)."""
    import json

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} expects KEY=VALUE, got {pair!r} (e.g. {flag} rounds=3)")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def task_options(args: argparse.Namespace) -> dict:
    """The ``--task-option`` pairs of ``args`` as keyword arguments for ``crl_envs.tasks.load``."""
    return parse_options(getattr(args, "task_option", []) or [], flag="--task-option")


def _run_play(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    started = time.perf_counter()

    from agents import SamplingParams
    from crl_envs import protocols, run_episodes, tasks
    from crl_envs.protocols.base import with_speaker_stops
    from crl_envs.runner import total_usage

    factory = protocols.get(args.protocol)
    options = parse_options(args.option)
    protocols.check_options(factory, options)  # before loading any model
    task = tasks.load(args.task, n=args.n, seed=args.seed, **task_options(args))
    spec = args.pool
    if spec == "pretrained":
        backend = play_backend(args.backend, args.n)
        spec = "pretrained" if backend == "hf" else f"pretrained-{backend}"
    elif args.backend != "auto":
        raise ConfigError(f"--backend {args.backend} applies to --pool pretrained only; for other pools name the "
                         "backend in the spec (e.g. --pool 'pretrained:gemma-3-270m?backend=vllm')")
    pool = build_pool(spec)
    t0 = time.perf_counter()
    max_new_tokens = args.max_new_tokens or PLAY_MAX_NEW_TOKENS.get(task.name, DEFAULT_MAX_NEW_TOKENS)
    sampling = with_speaker_stops(SamplingParams(temperature=args.temperature, max_new_tokens=max_new_tokens),
                                  len(pool))
    episodes = run_episodes(factory, pool, task, seed=args.seed, sampling=sampling,
                            options=options, progress=not args.quiet)
    played = time.perf_counter() - t0
    for ep in episodes:
        if args.quiet:
            continue
        ex = task.by_id(ep.example_id)
        print(f"=== {ep.example_id}: {ex.question}  (reference {ex.answer})")
        for t in ep.transcript:
            text = t.text.strip().replace("\n", " ")
            print(f"  [{t.phase_name}] {t.agent} ({t.model}): {text}")
        print(f"  -> system answer {ep.answer!r}, score {ep.score:g}")
    usage = total_usage(episodes)
    tokens = sum(u.total_tokens for u in usage.values())
    print(f"{episodes[0].protocol} on {task.name} with {pool!r}: "
          f"mean score {np.mean([e.score for e in episodes]):.3f} over {len(episodes)} questions, "
          f"{tokens / len(episodes):.0f} tokens per question; {time.perf_counter() - started:.0f} s "
          f"({played:.0f} s playing)")
    return 0


SUBCOMMANDS["play"] = (_add_play, _run_play, "play episodes and print transcripts and scores")


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option), if any."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def _describe(error: BaseException) -> str:
    """One line for ``error``: its message, with the exception's name where the message alone is unclear
    (a library error is named by the built-in kind it subclasses: ``TypeError``, not ``ConfigTypeError``)."""
    text = " ".join(str(error).split()) or type(error).__name__
    named = (OSError, TypeError, ImportError)
    if isinstance(error, named):
        kind = next(c for c in type(error).__mro__ if issubclass(c, named) and not issubclass(c, CrlEnvsError))
        if kind.__name__ not in text:
            text = f"{kind.__name__}: {text}"
    return text


def _quiet_model_loading() -> None:
    """No progress bar per loaded model (they would drown the command's own), without importing
    transformers: a command that fails its checks must not pay for it."""
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    else:  # read by huggingface_hub, and so by transformers, when they are imported
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    traceback_wanted = os.environ.get("CRL_ENVS_TRACEBACK", "") not in ("", "0")
    known = list(dict.fromkeys([*SUBCOMMANDS, *PLUGINS]))
    if command is not None and command not in known:
        hint = did_you_mean(command, known)
        print(f"crl-envs: error: unknown command {command!r}{hint}; commands: {', '.join(sorted(known))} "
              "(crl-envs --help)", file=sys.stderr)
        return 2
    try:
        if command in PLUGINS and command not in SUBCOMMANDS:
            import importlib

            importlib.import_module(PLUGINS[command][0])  # registers the subcommand
    except USER_ERRORS as e:
        if traceback_wanted:
            raise
        print(f"crl-envs {command}: error: {_describe(e)}", file=sys.stderr)
        return 2
    parser = CommandParser(prog="crl-envs", description="multi-LLM collaboration environments")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in known:
        if name in SUBCOMMANDS:
            add_arguments, _run, help_text = SUBCOMMANDS[name]
            sp = sub.add_parser(name, help=help_text)
            if name == command:  # only the chosen subcommand needs its arguments
                add_arguments(sp)
        else:
            sub.add_parser(name, help=PLUGINS[name][1])
    args = parser.parse_args(argv)
    _add, run, _help = SUBCOMMANDS[args.command]
    _quiet_model_loading()
    try:
        return run(args)
    except USER_ERRORS as e:
        if traceback_wanted:
            raise
        print(f"crl-envs {args.command}: error: {_describe(e)}", file=sys.stderr)
        return 2

