"""The public entry points: :func:`run_program`, :func:`run_tests`, :func:`run_many` and their
:class:`SandboxResult`."""

from __future__ import annotations

import ast
import builtins
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from crl_envs.sandbox.boundary import require_boundary
from crl_envs.sandbox.cgroup import cgroup_support
from crl_envs.sandbox.launch import TAIL_BYTES, Launch, SandboxLimits, read_outputs, source_fd, status
from crl_kit.errors import ConfigError, ConfigTypeError


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one run.

    ``status`` is one of ``"passed"``, ``"failed"`` (an exception, a failed test, a non-zero exit, an
    exit before the end, or code that is not valid UTF-8), ``"timeout"`` (wall clock or CPU limit),
    ``"output_limit"`` (wrote too much), ``"memory_limit"`` (the kernel killed a process of it at its
    cgroup's memory cap), ``"killed"`` (another signal, e.g. a segfault). ``stdout_tail`` is the last
    few KB of the program's stdout and stderr (then, for :func:`run_tests`, the checker's traceback);
    ``pid`` is the host pid of the program's launcher; ``namespaces`` the PID namespaces its processes
    (and the checker's) ran in, for :func:`namespace_processes`; ``cgroup`` the cgroup version that
    capped it as a whole (``""``: none here) and ``memory_peak_mb`` the most memory one of its
    sandboxes held (from the cgroup; ``None`` without one).
    """

    passed: bool
    status: str
    stdout_tail: str
    seconds: float
    returncode: int | None = None
    pid: int | None = None
    namespaces: tuple[str, ...] = ()
    cgroup: str = ""
    memory_peak_mb: float | None = None


def _check_code(what: str, code: object) -> None:
    if not isinstance(code, str):
        raise ConfigTypeError(f"{what} as a str, got {type(code).__name__}")


def _utf8(what: str, text: str) -> bytes | SandboxResult:
    """``text`` as UTF-8, or a failed result saying why not (a lone surrogate such as ``'\\ud800'``)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        return SandboxResult(False, "failed", f"sandbox: the {what} is not valid UTF-8 ({e.reason} at character "
                                              f"{e.start}); nothing ran", 0.0)


def _caps(launches: Sequence[Launch]) -> dict:
    peaks = [p for p in (launch.cgroup.peak_bytes() for launch in launches if launch.cgroup) if p is not None]
    support = cgroup_support() if any(launch.cgroup for launch in launches) else None
    return {"cgroup": support.version if support else "",
            "memory_peak_mb": round(max(peaks) / (1 << 20), 1) if peaks else None}


def _memory_note(limits: SandboxLimits) -> bytes:
    return (f"\nsandbox: killed at its memory cap (cgroup {cgroup_support().version}, {limits.memory_mb} MiB + "
            f"{limits.tmpfs_mb} MiB tmpfs for all its processes)\n").encode()


def _timeout_note(limits: SandboxLimits, wall_clock: bool) -> bytes:
    """The line a timed-out run's tail ends with: which limit stopped it, and the option to change."""
    how = f"killed at the wall clock after {limits.timeout:g} s" if wall_clock else \
        f"killed at its CPU limit ({limits.cpu_seconds} CPU-seconds)"
    return f"\nsandbox: timed out: {how}; pass a larger timeout= if the program needs longer\n".encode()


def run_program(
    code: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    file_size_mb: int = 16,
    tmpfs_mb: int = 64,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    site_packages: bool = False,
    unsafe_guard_only: bool = False,
) -> SandboxResult:
    """Run ``code`` in the sandbox; ``passed`` means it ran to the end without an exception.

    This is containment, not a verdict: a program that sets out to can report completion without
    completing (it holds the pipe). Score programs with :func:`run_tests`.

    Args:
        code: the whole program.
        timeout: wall-clock seconds; the CPU limit is this rounded up plus one.
        memory_mb: address-space limit per process; where there is a cgroup (``isolation()`` says),
            also the memory of all its processes together (plus ``tmpfs_mb``, whose pages count too).
        file_size_mb: largest file it may write (``RLIMIT_FSIZE``).
        tmpfs_mb: size of its private ``/tmp``, the only place it can write (all files together).
        max_processes: ``RLIMIT_NPROC`` inside its user namespace (threads count); with a cgroup, also
            its ``pids.max``.
        max_output_bytes: stdout+stderr beyond this kills the program (status ``"output_limit"``).
        site_packages: let it import installed third-party packages (numpy, ...).
        unsafe_guard_only: with ``CRL_SANDBOX_GUARD_ONLY=1``, run without a kernel boundary where
            there is none (rlimits and the audit hook only; not a security boundary).
    """
    _check_code("the sandbox needs the program", code)
    limits = SandboxLimits(timeout, memory_mb, file_size_mb, tmpfs_mb, max_processes, max_output_bytes)
    boundary = require_boundary(unsafe_guard_only, site_packages)
    data = _utf8("program", code)
    if isinstance(data, SandboxResult):
        return data
    source = source_fd(data)
    done_r, done_w = os.pipe()
    workdir = tempfile.mkdtemp(prefix="crl-sandbox-")
    start = time.monotonic()
    launch = None
    try:
        launch = Launch(boundary, "program", ["run", str(source), str(done_w)], [source, done_w], limits=limits,
                        site_packages=site_packages, workdir=workdir)
        os.close(done_w)
        done_w = None
        launch.read_namespace()
        out = launch.proc.stdout.fileno()
        outputs, status_ = read_outputs({out: limits.max_output_bytes, done_r: 16}, start + limits.timeout,
                                        launch.proc, (out, done_r))
        launch.kill()
        returncode = launch.proc.returncode
        passed = status_ is None and returncode == 0 and outputs[done_r] == b"done"
        tail = outputs[out]
        if not passed and launch.memory_killed():
            status_, tail = "memory_limit", tail + _memory_note(limits)
        wall_clock = status_ == "timeout"
        status_ = status_ or status(passed, returncode, start, limits.timeout)
        if status_ == "timeout":
            tail = tail[-TAIL_BYTES:] + _timeout_note(limits, wall_clock)
        return SandboxResult(passed, status_, tail[-TAIL_BYTES:].decode(errors="replace"),
                             time.monotonic() - start, returncode, launch.proc.pid,
                             (launch.namespace,) if launch.namespace else (), **_caps([launch]))
    finally:
        for fd in (source, done_r, done_w):
            if fd is not None:
                os.close(fd)
        if launch is not None:
            if launch.proc.returncode is None:
                launch.kill()
            launch.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _names_in(tests: str) -> tuple[set[str], set[str]]:
    tree = ast.parse(tests)
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded, bound


def free_names(tests: str) -> set[str]:
    """Every name the test code uses but never binds, builtins and standard library modules included."""
    loaded, bound = _names_in(tests)
    return loaded - bound


def unbound_names(tests: str) -> list[str]:
    """Names the test code uses but never binds, and that are neither builtins nor standard library
    modules: the program's functions. (A standard library module the tests use without importing it,
    such as ``math`` in MBPP's ``math.isclose`` asserts, is imported by the checker itself: an answer
    can never stand in for it.)"""
    return sorted(free_names(tests) - set(dir(builtins)) - set(sys.stdlib_module_names))


def _stdlib_imports(tests: str, names: Sequence[str]) -> list[str]:
    return sorted((free_names(tests) - set(names) - set(dir(builtins))) & set(sys.stdlib_module_names))


def run_tests(
    program: str,
    tests: str,
    *,
    names: Sequence[str] | None = None,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    file_size_mb: int = 16,
    tmpfs_mb: int = 64,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    site_packages: bool = False,
    unsafe_guard_only: bool = False,
) -> SandboxResult:
    """Run ``tests`` (asserts) against ``program``; it passes only if the checker ran all of them.

    The program and the checker run in two sandboxes. In the checker each of ``names`` (default:
    :func:`unbound_names`, the names ``tests`` uses but does not define, standard library modules
    excepted) stands for the program's object of that name: calling it sends the arguments to the
    program and returns its answer as a plain value. Every other name the tests use unbound that is a
    standard library module is imported in the checker, never taken from the program. The verdict is
    the checker's, reported on a pipe the program never holds; tests that never call the program fail.
    Limits are :func:`run_program`'s, for each of the two sandboxes; ``timeout`` covers the whole run.
    """
    _check_code("the sandbox needs the program", program)
    limits = SandboxLimits(timeout, memory_mb, file_size_mb, tmpfs_mb, max_processes, max_output_bytes)
    _check_code("run_tests needs the tests", tests)
    boundary = require_boundary(unsafe_guard_only, site_packages)
    program_data, tests_data = _utf8("program", program), _utf8("test code", tests)
    for data in (program_data, tests_data):
        if isinstance(data, SandboxResult):
            return data
    try:
        names = list(unbound_names(tests) if names is None else names)
        imports = _stdlib_imports(tests, names)
    except SyntaxError as e:
        raise ConfigError(f"run_tests: the test code does not parse (line {e.lineno}: {e.msg}); "
                         "fix the tests, not the program") from None
    program_fd, tests_fd = source_fd(program_data), source_fd(tests_data)
    req_r, req_w = os.pipe()  # checker -> program
    ans_r, ans_w = os.pipe()  # program -> checker
    verdict_r, verdict_w = os.pipe()  # checker -> here
    mine = [program_fd, tests_fd, req_r, req_w, ans_r, ans_w, verdict_w]
    workdirs = [tempfile.mkdtemp(prefix="crl-sandbox-"), tempfile.mkdtemp(prefix="crl-checker-")]
    start = time.monotonic()
    launches: list[Launch] = []
    try:
        common = dict(limits=limits, site_packages=site_packages)
        launches.append(Launch(boundary, "program", ["serve", str(program_fd), str(req_r), str(ans_w)],
                               [program_fd, req_r, ans_w], workdir=workdirs[0], **common))
        launches.append(Launch(boundary, "checker",
                               [str(tests_fd), str(req_w), str(ans_r), str(verdict_w), json.dumps(names),
                                json.dumps(imports)],
                               [tests_fd, req_w, ans_r, verdict_w], workdir=workdirs[1], **common))
        for fd in mine:
            os.close(fd)
        mine = []
        for launch in launches:
            launch.read_namespace()
        program_out, checker_out = (launch.proc.stdout.fileno() for launch in launches)
        outputs, status_ = read_outputs(
            {program_out: limits.max_output_bytes, checker_out: limits.max_output_bytes, verdict_r: 16},
            start + limits.timeout,
            launches[1].proc, (checker_out, verdict_r),
        )
        program_proc, checker_proc = (launch.proc for launch in launches)
        program_code = program_proc.poll()  # before the kill: did it die of a signal (CPU limit, ...)?
        for launch in reversed(launches):  # the checker first: a checker still waiting on the program reports
            launch.kill()  # the wall clock's kill, not the exit 1 that the program's end would give it
        passed = status_ is None and checker_proc.returncode == 0 and outputs[verdict_r] == b"pass"
        tail = outputs[program_out][-TAIL_BYTES:] + outputs[checker_out][-TAIL_BYTES:]
        if not passed and any(launch.memory_killed() for launch in launches):
            status_, tail = "memory_limit", tail + _memory_note(limits)
        wall_clock = status_ == "timeout"
        if status_ is None and not passed:
            status_ = status(False, program_code if program_code not in (None, 0, 1) else checker_proc.returncode,
                             start, limits.timeout)
        if status_ == "timeout":
            tail += _timeout_note(limits, wall_clock)
        return SandboxResult(passed, status_ or "passed", tail.decode(errors="replace"), time.monotonic() - start,
                             checker_proc.returncode, program_proc.pid,
                             tuple(launch.namespace for launch in launches if launch.namespace), **_caps(launches))
    finally:
        for fd in [*mine, verdict_r]:
            os.close(fd)
        for launch in launches:
            if launch.proc.returncode is None:
                launch.kill()
            launch.close()
        for workdir in workdirs:
            shutil.rmtree(workdir, ignore_errors=True)


def run_many(
    programs: Sequence[str],
    *,
    tests: Sequence[str] | None = None,
    names: Sequence[Sequence[str] | None] | None = None,
    workers: int | None = None,
    progress: bool = False,
    **limits,
) -> list[SandboxResult]:
    """Run many programs in parallel (``workers`` at a time, default the CPU count); results in order.

    With ``tests`` (one per program) each runs through :func:`run_tests` (with ``names[i]`` as its
    ``names``, when given), else :func:`run_program`; ``limits`` are their keyword arguments, applied
    to every run.
    """
    programs = list(programs)
    if tests is not None and len(tests) != len(programs):
        raise ConfigError(f"run_many needs one tests string per program, got {len(tests)} for {len(programs)}")
    if names is not None and (tests is None or len(names) != len(programs)):
        raise ConfigError("run_many: names= needs tests= and one entry (a list of names, or None) per program")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if not programs:
        return []
    if tests is None:
        job = lambda i: run_program(programs[i], **limits)  # noqa: E731
    else:
        job = lambda i: run_tests(programs[i], tests[i], names=None if names is None else names[i], **limits)  # noqa: E731
    with ThreadPoolExecutor(max_workers=min(workers, len(programs))) as pool:
        results = pool.map(job, range(len(programs)))
        if progress:
            from tqdm.auto import tqdm

            results = tqdm(results, total=len(programs), desc="sandbox")
        return list(results)
