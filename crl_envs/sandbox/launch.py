"""Starting one sandboxed interpreter and cleaning up after it: the in-sandbox program's text, its
rlimit arguments, the cgroup it starts in, reading its output with a cap, killing it, reaping it.

| piece | what |
|---|---|
| :class:`SandboxLimits` | the limits of one sandbox, validated once; its rlimit arguments |
| :func:`bootstrap` | the ``-c`` text: a loader plus the ``inside`` modules' source, run as package ``_sandbox`` |
| :class:`Launch` | one interpreter in bwrap (behind a shell that waits until it is in its cgroup) |
| :func:`read_outputs` | reads pipes with caps until the run ends, the deadline passes or a cap is hit |
"""

from __future__ import annotations

import functools
import json
import math
import os
import select
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from crl_envs.sandbox.boundary import Boundary, as_user, clean_env
from crl_envs.sandbox.cgroup import Cgroup, cgroup_support
from crl_envs.sandbox.inside import MODULES
from crl_envs.sandbox.procs import is_zombie, namespace_processes, reap_orphans, session_processes
from crl_envs.sandbox.seccomp import seccomp_fd
from crl_kit.errors import ConfigError

TAIL_BYTES = 4096
# Started as the launcher: waits until the parent has put it into its cgroup, then becomes bwrap.
_WAIT_FOR_CGROUP = 'read -r _ || exit 125; exec "$@" </dev/null'
_LOADER = """
import sys, types
def _load(sources):
    package = types.ModuleType("_sandbox")
    package.__path__ = []
    sys.modules["_sandbox"] = package
    for name, source in sources:
        module = types.ModuleType("_sandbox." + name)
        module.__package__ = "_sandbox"
        sys.modules[module.__name__] = module
        setattr(package, name, module)
        exec(compile(source, "<sandbox>/" + name + ".py", "exec"), module.__dict__)
    return package
_load(_SOURCES).%s.main(sys.argv)
"""


@functools.lru_cache(maxsize=4)
def bootstrap(entry: str) -> str:
    """The ``python -c`` text that runs ``inside/<entry>.py``'s ``main(sys.argv)`` inside the sandbox
    (the ``inside`` modules travel as text; nothing of the host package is imported there)."""
    if entry not in ("program", "checker"):
        raise ConfigError(f"no in-sandbox entry point {entry!r}; use 'program' or 'checker'")
    folder = resources.files("crl_envs.sandbox.inside")
    sources = [(name, folder.joinpath(f"{name}.py").read_text("utf-8")) for name in MODULES]
    return f"_SOURCES = {sources!r}\n" + _LOADER % entry


@dataclass(frozen=True)
class SandboxLimits:
    """The limits of one sandbox, validated once when made (:func:`~crl_envs.sandbox.run_program`'s
    keyword arguments say what each means).

    Raises:
        ValueError: a limit that is not positive.
    """

    timeout: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    tmpfs_mb: int = 64
    max_processes: int = 16
    max_output_bytes: int = 1 << 20

    def __post_init__(self):
        if (self.timeout <= 0 or self.memory_mb <= 0 or self.file_size_mb < 0 or self.tmpfs_mb < 1
                or self.max_processes < 1 or self.max_output_bytes < 1):
            raise ConfigError("sandbox limits must be positive (timeout, memory_mb, tmpfs_mb, max_processes, "
                             "max_output_bytes)")

    @property
    def cpu_seconds(self) -> int:
        """``RLIMIT_CPU``: the wall clock rounded up, plus one."""
        return math.ceil(self.timeout) + 1

    def rlimit_args(self) -> list[str]:
        """The in-sandbox entry points' ``argv[1:5]`` (``inside/guard.py``'s ``limits_from_argv``)."""
        return [str(self.memory_mb << 20), str(self.cpu_seconds), str(self.file_size_mb << 20),
                str(self.max_processes)]


def source_fd(data: bytes) -> int:
    fd = os.memfd_create("source", 0)
    while data:
        data = data[os.write(fd, data):]
    return fd


class Launch:
    """One sandboxed interpreter running ``inside/<entry>.py``: its process, output pipe, PID namespace
    and cgroup."""

    def __init__(self, boundary: Boundary, entry: str, args: list[str], pass_fds: list[int], *,
                 limits: SandboxLimits, site_packages: bool, workdir: str):
        """Start ``entry`` in ``boundary`` (``-S`` unless ``site_packages``) under ``limits``, inside a
        fresh cgroup where this machine has one (memory ``memory_mb`` plus the tmpfs; ``max_processes``
        plus the two bwrap processes)."""
        info_r = info_w = filter_fd = None
        python = [boundary.python, "-s" if site_packages else "-S", "-B", "-u", "-c", bootstrap(entry)]
        rlimits, tmpfs_bytes = limits.rlimit_args(), limits.tmpfs_mb << 20
        if boundary.argv:
            info_r, info_w = os.pipe()
            filter_fd = seccomp_fd(boundary.seccomp) if boundary.seccomp else None
            argv = boundary.command([*python, *rlimits, "/tmp", *args], tmpfs_bytes=tmpfs_bytes, info_fd=info_w,
                                    seccomp_fd=filter_fd)
            cwd, env = "/", clean_env("/tmp")
            fds = [*pass_fds, info_w] + ([filter_fd] if filter_fd is not None else [])
        else:
            argv, cwd, env, fds = [*python, *rlimits, workdir, *args], workdir, clean_env(workdir), pass_fds
        self.info_fd = info_r
        self.namespace: str | None = None
        self.init_pid: int | None = None
        support = cgroup_support()
        self.cgroup = Cgroup(support, memory_bytes=(limits.memory_mb << 20) + tmpfs_bytes,
                             max_processes=limits.max_processes + 2) if support else None
        try:
            self.proc = subprocess.Popen(["/bin/sh", "-c", _WAIT_FOR_CGROUP, "sh", *argv], cwd=cwd, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         start_new_session=True, close_fds=True, pass_fds=fds,
                                         **as_user(boundary.user))
        except BaseException:
            if self.cgroup is not None:
                self.cgroup.remove(wait=0.0)
            raise
        finally:
            for fd in (info_w, filter_fd):
                if fd is not None:
                    os.close(fd)
        if self.cgroup is not None:
            try:
                self.cgroup.add(self.proc.pid)
            except OSError:  # not in the group: it runs capped by its rlimits only, and its result says so
                self.cgroup.remove(wait=0.0)
                self.cgroup = None
        try:
            self.proc.stdin.write(b"go\n")
        except OSError:
            pass  # it died already: the run fails and the status says how
        finally:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def read_namespace(self) -> None:
        """Learn the sandbox's PID namespace from bwrap's info pipe (written once it is set up)."""
        if self.info_fd is None or self.namespace is not None:
            return
        data = b""
        try:
            while select.select([self.info_fd], [], [], 5.0)[0]:  # bwrap writes it and closes it at once
                chunk = os.read(self.info_fd, 4096)
                if not chunk:
                    break
                data += chunk
            self.init_pid = int(json.loads(data.decode())["child-pid"])
            self.namespace = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def kill(self, settle: float = 5.0) -> None:
        """SIGKILL the launcher's group (its PID namespace dies with it); wait until nothing of it runs,
        and reap what of it was handed to this process (under a subreaper or as PID 1)."""
        self.read_namespace()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            # Inside bwrap everything lives in the PID namespace; without it, in the launcher's session.
            left = namespace_processes(self.namespace) if self.namespace else session_processes(self.proc.pid)
            if self.cgroup is not None:  # (v2 may list a zombie until it is reaped: not one to wait for)
                left = sorted(set(left) | {pid for pid in self.cgroup.processes() if not is_zombie(pid)})
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)
        reap_orphans({self.init_pid} if self.init_pid else set(), self.proc.pid, settle=max(0.0, min(
            1.0, deadline - time.monotonic())))

    def memory_killed(self) -> bool:
        """Did the kernel kill a process of it for the cgroup's memory limit?"""
        return self.cgroup is not None and self.cgroup.oom_kills() > 0

    def close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.info_fd is not None:
            os.close(self.info_fd)
            self.info_fd = None
        if self.cgroup is not None:
            self.cgroup.remove()


def status(passed: bool, returncode: int | None, start: float, timeout: float) -> str:
    if passed:
        return "passed"
    if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or (
        returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) and time.monotonic() - start >= timeout * 0.9
    ):
        return "timeout"
    if returncode is not None and (returncode < 0 or returncode > 128):
        return "killed"
    return "failed"


def read_outputs(caps: dict[int, int], deadline: float, until: subprocess.Popen,
                 until_fds: Sequence[int]) -> tuple[dict[int, bytes], str | None]:
    """Read the fds in ``caps`` (keeping each one's tail) until every fd of ``until_fds`` is closed and
    ``until`` has exited; stop early at the deadline (``"timeout"``) or when an fd passes its cap."""
    outputs = {fd: b"" for fd in caps}
    totals = dict.fromkeys(caps, 0)
    with selectors.DefaultSelector() as selector:
        for fd in caps:
            selector.register(fd, selectors.EVENT_READ)
        while any(fd in selector.get_map() for fd in until_fds):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return outputs, "timeout"
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                totals[key.fd] += len(chunk)
                outputs[key.fd] = (outputs[key.fd] + chunk)[-2 * TAIL_BYTES :]
                if totals[key.fd] > caps[key.fd]:
                    return outputs, "output_limit"
    try:
        until.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return outputs, "timeout"
    return outputs, None
