"""Run untrusted Python programs (model-written code) and tell whether they ran to completion.

Each program runs in a fresh ``python`` subprocess, in a fresh temporary directory as its working
directory, with layered defences:

- **kernel namespaces** where ``unshare`` works (root on Linux): a private network namespace (no
  network at all, not even loopback to the host's services), a private PID namespace with its own
  ``/proc`` (the program cannot see, signal or read the environment of any outside process, and the
  kernel kills everything in the namespace when its first process dies);
- **resource limits** set before the program runs: CPU seconds, address space, file size, process
  count, no core dumps;
- **a wall-clock timeout** that kills the whole process group, then any straggler in the session;
- **an audit hook** (:pep:`578`) in the child that refuses sockets, signals to other processes,
  ``fork``/``exec``/``subprocess``, ``ctypes``, writes (and renames, deletes, ...) outside the temp
  directory, opening directories outside it (``dir_fd=`` escapes) and reads of other processes'
  ``/proc`` entries;
- **a scrubbed environment**: only ``PATH``, ``LANG``, ``HOME``/``TMPDIR`` (the temp dir),
  ``PYTHONHASHSEED=0`` and single-thread BLAS settings; nothing of the parent's environment;
- **a capped output**: stdout and stderr are read in chunks and the program is killed once it has
  written more than ``max_output_bytes``.

A program *passes* when its code runs to the end without an exception and the bootstrap then
prints a per-run random token; ``exit(0)`` or ``os._exit(0)`` before the end is a failure.

The audit hook is a Python-level guard, not a security boundary against code that sets out to
defeat it; the namespaces, limits and process-group kill are what contain such code.

Example:
    >>> from crl_envs.sandbox import run_program
    >>> run_program("assert sum(range(4)) == 6").passed
    True
    >>> run_program("while True: pass", timeout=1).status
    'timeout'
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

PROGRAM_FILE = "program.py"  # the bootstrap below reads this name
TAIL_BYTES = 4096

# Runs in the child before the candidate program: limits, audit hook, then the program itself.
# argv: memory bytes, cpu seconds, file-size bytes, max processes. stdin: one line, the token.
_BOOTSTRAP = r"""
import os, sys, resource, traceback
def _setup():
    token = sys.stdin.readline().strip()
    null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
    memory, cpu, fsize, nproc = (int(a) for a in sys.argv[1:5])
    for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu),
                         (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NPROC, nproc),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value + 1 if limit == resource.RLIMIT_CPU else value))
    sys.argv = ['program.py']
    with open('program.py', encoding="utf-8") as f:
        code = compile(f.read(), 'program.py', "exec")
    root = os.path.realpath(os.getcwd())
    me = str(os.getpid())
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    refused = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "os.system", "os.exec",
               "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen", "pty.spawn",
               "os.setuid", "os.setgid", "os.chroot", "gc.get_objects", "gc.get_referrers",
               "gc.get_referents", "sys._current_frames", "sys.addaudithook", "ctypes.dlsym",
               "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata", "ctypes.cdata/buffer",
               "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr", "ctypes.set_errno"}
    path_events = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                   "os.symlink": (1,), "os.link": (1,), "os.truncate": (0,), "os.chmod": (0,),
                   "os.chown": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "os.chflags": (0,)}
    def inside(path):
        if isinstance(path, int):
            return True
        try:
            p = realpath(fsdecode(path))
        except Exception:
            return False
        return p == root or p.startswith(root + sep)
    def other_process(path):
        if isinstance(path, int):
            return False
        try:
            p = realpath(fsdecode(path))
        except Exception:
            return True
        parts = p.split(sep)
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != me
    def outside_dir(path):  # a directory fd outside would let dir_fd= relative paths escape
        return not isinstance(path, int) and not inside(path) and os.path.isdir(path)
    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(flags, int) and flags & write_flags) or (mode and any(c in mode for c in "wax+"))
            if (writing and not inside(path)) or other_process(path) or outside_dir(path):
                raise PermissionError("sandbox: %s refused" % (path,))
        elif event in refused:
            raise PermissionError("sandbox: %s refused" % event)
        elif event in ("os.kill", "os.killpg") and args[0] not in (0, os.getpid()):
            raise PermissionError("sandbox: signals to other processes refused")
        elif event in path_events:
            for i in path_events[event]:
                if not inside(args[i]):
                    raise PermissionError("sandbox: %s outside the working directory refused" % event)
    sys.addaudithook(hook)
    return token, code
_token, _code = _setup()
del _setup
_globals = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": 'program.py'}
try:
    exec(_code, _globals)
except BaseException:
    try:
        sys.stdout.flush()
    except Exception:
        pass
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
for _stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
    try:
        _stream.flush()
    except Exception:
        pass
os.write(1, ("\n" + _token + "\n").encode())
os._exit(0)
"""


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one program.

    ``status`` is one of ``"passed"``, ``"failed"`` (an exception, a non-zero exit, or an exit before
    the end), ``"timeout"`` (wall clock or CPU limit), ``"output_limit"`` (wrote too much),
    ``"killed"`` (another signal, e.g. a segfault). ``stdout_tail`` is the last few KB of stdout and
    stderr together; ``pid`` is the process (and session) id the program ran under.
    """

    passed: bool
    status: str
    stdout_tail: str
    seconds: float
    returncode: int | None = None
    pid: int | None = None


@functools.lru_cache(maxsize=1)
def isolation() -> tuple[str, ...]:
    """The ``unshare`` prefix this machine supports: PID+mount+network namespaces, network only, or none."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return ()
    for prefix in (
        ("unshare", "--net", "--pid", "--fork", "--mount", "--mount-proc", "--kill-child"),
        ("unshare", "--net"),
    ):
        try:
            done = subprocess.run([*prefix, sys.executable, "-c", "pass"], capture_output=True, timeout=30,
                                  env=_clean_env(tempfile.gettempdir()))
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def _clean_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def session_processes(session_id: int) -> list[int]:
    """Pids of live processes whose session id is ``session_id`` (Linux ``/proc``; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 3 and fields[3] == str(session_id) and fields[0] != "Z":
            found.append(int(entry))
    return found


def _kill_session(pid: int, *, settle: float = 5.0) -> None:
    """SIGKILL the program's process group and anything else in its session, and wait (at most
    ``settle`` seconds) until none of them is running: a killed process takes a moment to die."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + settle
    while True:
        stragglers = session_processes(pid)  # escaped the group with setpgid but not the session
        if not stragglers or time.monotonic() > deadline:
            return
        for straggler in stragglers:
            try:
                os.kill(straggler, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def run_program(
    code: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    file_size_mb: int = 16,
    max_processes: int = 64,
    max_output_bytes: int = 1 << 20,
    site_packages: bool = False,
) -> SandboxResult:
    """Run ``code`` in a sandboxed subprocess; it passes if it runs to the end without an exception.

    Args:
        code: the whole program (for a test: solution, then the asserts).
        timeout: wall-clock seconds; the CPU limit is this rounded up plus one.
        memory_mb: address-space limit of the program's process.
        file_size_mb: largest file it may write (inside its temp dir).
        max_processes: ``RLIMIT_NPROC`` (the kernel ignores it for root; fork is refused anyway).
        max_output_bytes: stdout+stderr beyond this kills the program (status ``"output_limit"``).
        site_packages: let the program import installed third-party packages (numpy, ...). Off by
            default: the standard library is enough for HumanEval and MBPP, and interpreter start-up
            without ``site`` is several times faster.
    """
    if not isinstance(code, str):
        raise TypeError(f"run_program needs the program as a str, got {type(code).__name__}")
    if timeout <= 0 or memory_mb <= 0 or file_size_mb < 0 or max_processes < 1 or max_output_bytes < 1:
        raise ValueError("run_program limits must be positive (timeout, memory_mb, max_processes, max_output_bytes)")
    workdir = tempfile.mkdtemp(prefix="crl-sandbox-")
    start = time.monotonic()
    proc = None
    try:
        with open(os.path.join(workdir, PROGRAM_FILE), "w", encoding="utf-8") as f:
            f.write(code)
        token = secrets.token_hex(16)
        limits = [str(memory_mb << 20), str(math.ceil(timeout) + 1), str(file_size_mb << 20), str(max_processes)]
        argv = [*isolation(), sys.executable, "-s" if site_packages else "-S", "-B", "-u", "-c", _BOOTSTRAP, *limits]
        proc = subprocess.Popen(
            argv, cwd=workdir, env=_clean_env(workdir), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )
        try:
            proc.stdin.write((token + "\n").encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        tail, total, status = _read_capped(proc, start + timeout, max_output_bytes)
        _kill_session(proc.pid)
        returncode = proc.wait()
        marker = f"\n{token}\n".encode()
        passed = status is None and returncode == 0 and tail.endswith(marker)
        if passed:
            tail = tail[: -len(marker)]
        if status is None:
            if passed:
                status = "passed"
            elif returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or (
                returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) and time.monotonic() - start >= timeout * 0.9
            ):
                status = "timeout"
            elif returncode is not None and (returncode < 0 or returncode > 128):
                status = "killed"
            else:
                status = "failed"
        return SandboxResult(passed, status, tail[-TAIL_BYTES:].decode(errors="replace"),
                             time.monotonic() - start, returncode, proc.pid)
    finally:
        if proc is not None:
            if proc.returncode is None:  # not reaped yet, so its pid cannot have been reused
                _kill_session(proc.pid)
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _read_capped(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, int, str | None]:
    """Read the merged output until EOF, the deadline or ``cap`` bytes; keep only the tail."""
    tail, total = b"", 0
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return tail, total, "timeout"
            if not selector.select(remaining):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            total += len(chunk)
            tail = (tail + chunk)[-2 * TAIL_BYTES :]
            if total > cap:
                return tail, total, "output_limit"
    try:  # output closed; the process should exit at once
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return tail, total, "timeout"
    return tail, total, None


def run_many(
    programs: Sequence[str],
    *,
    workers: int | None = None,
    progress: bool = False,
    **limits,
) -> list[SandboxResult]:
    """Run many programs in parallel (``workers`` at a time, default the CPU count); results in order.

    ``limits`` are :func:`run_program`'s keyword arguments, applied to every program.
    """
    programs = list(programs)
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not programs:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(programs))) as pool:
        results = pool.map(lambda code: run_program(code, **limits), programs)
        if progress:
            from tqdm.auto import tqdm

            results = tqdm(results, total=len(programs), desc="sandbox")
        return list(results)


__all__ = ["SandboxResult", "run_program", "run_many", "isolation", "session_processes"]
