"""crl-envs: multi-LLM collaboration protocols as PettingZoo environments.

Factories (``crl_envs.<protocol>_v0(pool, task, **options)``) return ``pettingzoo.ParallelEnv``
instances; :func:`run_episodes` plays many of them in lockstep with batched generation.
"""

from crl_envs import tasks, valuation, wrappers
from crl_envs.protocols import PROTOCOLS
from crl_envs.protocols.blender import env as blender_v0
from crl_envs.protocols.cascade import env as cascade_v0
from crl_envs.protocols.debate import env as debate_v0
from crl_envs.protocols.feedback import env as feedback_v0
from crl_envs.protocols.judge import env as judge_v0
from crl_envs.protocols.knowledge import env as knowledge_v0
from crl_envs.protocols.moa import env as moa_v0
from crl_envs.protocols.refine import env as refine_v0
from crl_envs.protocols.relay import env as relay_v0
from crl_envs.protocols.routing import env as routing_v0
from crl_envs.protocols.topology import env as topology_v0
from crl_envs.protocols.vote import env as vote_v0
from crl_envs.runner import Episode, TurnRecord, Usage, run_episodes, total_usage

__version__ = "0.1.0"


def _register_with_pettingzoo() -> None:
    """Expose every protocol as ``pettingzoo.make("parallel", "crl_envs/<name>-v0", pool=..., task=...)``."""
    try:
        import pettingzoo
    except ImportError:  # pragma: no cover
        return
    register = getattr(pettingzoo, "register", None)
    if register is None:  # pettingzoo < 1.27
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # re-registration on module reload
        for name, factory in PROTOCOLS.items():
            register("parallel", f"crl_envs/{name}-v0", factory)


_register_with_pettingzoo()

__all__ = ["tasks", "wrappers", "valuation", "PROTOCOLS", "debate_v0", "vote_v0", "blender_v0", "cascade_v0", "feedback_v0",
           "judge_v0", "knowledge_v0", "moa_v0", "refine_v0", "relay_v0", "routing_v0", "topology_v0", "run_episodes", "Episode", "TurnRecord",
           "Usage", "total_usage"]
