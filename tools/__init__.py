"""Tools that build what the library ships (the zoo's models). Not part of the installed package: run
them from a checkout, ``python -m tools.zoo.build`` and ``python -m tools.zoo.multitask``. They import
:mod:`crl_envs` and :mod:`agents`; nothing in those packages imports them."""
