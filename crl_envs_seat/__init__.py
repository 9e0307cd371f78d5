"""The verifiers taskset ``crl-envs-seat``: verifiers imports a taskset by a top-level module name, so this
module re-exports the learner's seat environment of :mod:`crl_envs.integrations.verifiers_env`."""

from crl_envs.integrations.verifiers_env import SeatEnv, SeatTaskset

__all__ = ["SeatEnv", "SeatTaskset"]
