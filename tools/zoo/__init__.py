"""The zoo's builders: ``python -m tools.zoo.build`` (the arith zoo, ``agents.pool("zoo")``) and
``python -m tools.zoo.multitask`` (the multi-task zoo v3, the ``zoo-<name>`` pools). What they build is
declared in :mod:`agents.zoo.specs`, which the runtime reads to load the models; what both train with
(a fresh model, the training loop, saving, determinism, the :class:`~tools.zoo.common.Sampler`) is
:mod:`tools.zoo.common`."""
