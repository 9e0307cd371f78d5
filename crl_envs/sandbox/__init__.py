"""Run untrusted Python programs (model-written code) inside a kernel boundary, and score them with
verdicts the program cannot forge.

**The boundary** is bubblewrap (``bwrap``): every program runs in its own user, PID, network, IPC,
UTS and cgroup namespaces, as uid 65534 with no capabilities, on a read-only view of ``/usr`` and
the Python installation only (no ``/root``, ``/home``, project, host ``/tmp``, ``/etc`` or
``/proc``), with a private size-capped tmpfs at ``/tmp`` as the only writable place and a clean
environment. When the parent runs as root and the interpreter is readable by uid 65534, bwrap itself
is started as host uid 65534 too, so the program is unprivileged on the host as well. Inside:
rlimits (CPU, address space, file size, processes, no core dumps), and the audit hook (:pep:`578`)
that refuses sockets, process spawning, ``ctypes``, writes outside ``/tmp`` and frame/``gc``
introspection, as defence in depth. A seccomp filter refuses ``memfd_create`` and a few other syscalls
that hold kernel memory no rlimit counts, and where this machine has a writable memory cgroup (v2 or
v1) each sandbox runs in its own, which caps the memory, processes and CPU bandwidth of all its
processes together (:func:`isolation` says what is in use). The parent kills the whole sandbox at the
wall-clock limit (its PID namespace dies with it), caps the output it reads, and reaps what it started.

**The verdict** (:func:`run_tests`) is decided by a second sandboxed process, the *checker*, which
runs the test code; the *program* runs in its own sandbox and only answers the checker's calls
over a pipe: each call's arguments go in, the return value comes back in a strict tagged encoding
that the checker decodes into plain ``int``/``float``/``str``/``bytes``/``bool``/``None``/
``list``/``tuple``/``dict``/``set`` values only (any other object comes back as an opaque handle
that can be passed back to the program but refuses to be compared, hashed or tested for truth).
The asserts are evaluated in the checker, on those plain values; the checker reports ``pass`` on a
pipe only it holds. Nothing the program can read (the tests and expected values never enter its
process), write (its stdout, its exit status, its answer pipe) or patch (its own builtins) can make
a failing program pass: to pass it has to return the right values.

With no boundary (bwrap missing, or user namespaces disabled) nothing runs: :class:`SandboxUnavailable`
names the fix. ``unsafe_guard_only=True`` *and* ``CRL_SANDBOX_GUARD_ONLY=1`` together run the same
processes without bwrap (rlimits + audit hook only, not a security boundary).

Layout (this package): ``boundary`` (probing bwrap, its command), ``seccomp`` (the filter),
``cgroup`` (per-sandbox groups), ``launch`` (one sandboxed interpreter: limits, pipes, killing,
reaping), ``run`` (this public API), and ``inside/`` (the programs that run in the sandbox, as
ordinary modules that are sent in as text).

Example:
    >>> from crl_envs.sandbox import run_program, run_tests
    >>> run_program("assert sum(range(4)) == 6").passed
    True
    >>> run_tests("def f(x):\\n    return 2 * x", "assert f(3) == 6").passed
    True
    >>> run_tests("class Yes:\\n    __eq__ = lambda s, o: True\\ndef f(x):\\n    return Yes()",
    ...           "assert f(3) == 6").passed
    False
"""

from crl_envs.sandbox.boundary import GUARD_ONLY_ENV, INSTALL_HINT, NOBODY, SandboxUnavailable, isolation
from crl_envs.sandbox.boundary import boundary as _boundary
from crl_envs.sandbox.cgroup import cgroup_support
from crl_envs.sandbox.launch import TAIL_BYTES, SandboxLimits
from crl_envs.sandbox.procs import namespace_processes, session_processes
from crl_envs.sandbox.run import SandboxResult, free_names, run_many, run_program, run_tests, unbound_names

__all__ = ["SandboxResult", "SandboxLimits", "SandboxUnavailable", "run_program", "run_tests", "run_many", "isolation",
           "unbound_names", "free_names", "namespace_processes", "session_processes", "cgroup_support", "GUARD_ONLY_ENV",
           "INSTALL_HINT", "NOBODY", "TAIL_BYTES", "_boundary"]
