"""``python -m crl_envs.commands``: the ``crl-envs`` command without its console script."""

import sys

from crl_envs.commands import main

sys.exit(main())
