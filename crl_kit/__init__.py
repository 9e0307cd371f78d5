"""The project's bottom layer: its error types (:mod:`crl_kit.errors`), shared checks
(:mod:`crl_kit.validation`), the one file reader and atomic writer (:mod:`crl_kit.safe_io`) and the one
digest and JSON form of plain data (:mod:`crl_kit.serial`).

A package of its own, below ``agents``, ``crl_envs`` and ``trainers``, so that each of them (``agents``
included, which imports nothing of ``crl_envs``) raises the same errors and words its checks the same
way. It imports nothing of the project, and nothing here is imported by ``import crl_kit``.
"""
