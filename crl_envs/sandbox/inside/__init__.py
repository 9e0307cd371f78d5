"""The programs that run *inside* the sandbox, as ordinary modules (linted, imported by tests).

They are never imported inside the sandbox from the host package: :func:`crl_envs.sandbox.launch.bootstrap`
reads their text and sends it in, where a small loader executes them as the package ``_sandbox``
(so their relative imports resolve to each other and nothing else). They may import only the standard
library and each other.

| module | runs in | what |
|---|---|---|
| ``codec`` | both | length-prefixed JSON frames; the tagged, strict encoding of values |
| ``guard`` | both | rlimits and the audit hook; reading the source fd; flushing |
| ``program`` | the program's sandbox | runs the candidate code, then answers the checker's calls |
| ``checker`` | the checker's sandbox | runs the tests; the program's names are proxies; writes the verdict |
"""

MODULES = ("codec", "guard", "program", "checker")
