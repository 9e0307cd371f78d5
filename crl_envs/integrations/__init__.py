"""The protocols inside the trainers people already run: the learner's seat of a protocol, played from outside.

- :mod:`crl_envs.integrations.seat` — :class:`~crl_envs.integrations.seat.LearnerSeat`, one episode through
  the library's runner with the learner's turns supplied by the caller, and its reward (system score,
  LOO or Shapley credit).
- :mod:`crl_envs.integrations.trl_environment` — TRL's ``GRPOTrainer(environment_factory=...)``
  (extra ``crl-envs[trl]``).
- :mod:`crl_envs.integrations.openenv_server` — an OpenEnv ``Environment`` and its HTTP app
  (extra ``crl-envs[openenv]``).

The modules are imported by name (each needs its extra), not from here.
"""
