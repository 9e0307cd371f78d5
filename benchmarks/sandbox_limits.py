"""Measure the sandbox's limits against the attacks of issue 24, before and after, side by side.

Usage: ``python benchmarks/sandbox_limits.py [--before REV]`` (as root on Linux with bwrap; default
``13ab484``, the last commit with the sandbox as one file: no seccomp, no cgroup, no reaping).

Each attack runs through ``run_program`` of the old module (read from git, loaded from a temp file)
and of the current one. "host" is the largest drop of the host's available memory while it ran
(sampled every 20 ms, so other processes add noise); "peak" is the sandbox cgroup's own figure. The
figures in docs/sandbox.md's threat table are this script's output.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil

from crl_envs import sandbox
from crl_envs.sandbox import run as sandbox_run

ROOT = Path(__file__).resolve().parents[1]
SPAWN = '''
import _posixsubprocess, os, sys
def spawn(argv):
    er, ew = os.pipe()
    pid = _posixsubprocess.fork_exec(argv, [os.fsencode(argv[0])], True, (ew,), None, None, -1, -1, -1, 1, -1, 1,
                                     er, ew, False, False, -1, None, None, None, -1, None, False)
    os.close(er); os.close(ew)
    return pid
'''
MEMFD = textwrap.dedent("""
    import os
    fds = []
    try:
        for i in range(100):
            fd = os.memfd_create('x')
            os.write(fd, b'x' * (15 << 20))
            fds.append(fd)
            print('memfd', (i + 1) * 15, flush=True)
    except OSError as e:
        print('refused', e.errno, flush=True)
""")
CHILD_400 = "x = bytearray(400 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\nprint('held 400', flush=True)\n" \
            "import time\ntime.sleep(1)\n"
PROCESSES_400 = SPAWN + f"pids = [spawn([sys.executable, '-S', '-c', {CHILD_400!r}]) for _ in range(10)]\n" \
                        "for pid in pids:\n    os.waitpid(pid, 0)\n"
SPIN = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 3: pass\n"
CPU = SPAWN + "import time\nstart = time.monotonic()\n" \
              f"pids = [spawn([sys.executable, '-S', '-c', {SPIN!r}]) for _ in range(4)]\n" \
              "for pid in pids:\n    os.waitpid(pid, 0)\nt = os.times()\n" \
              "print('cpu', round(t.children_user + t.children_system, 1), 'wall', round(time.monotonic() - start, 1))\n"
FORK_LOOP = textwrap.dedent("""
    import _posixsubprocess, os
    out = os.open('/tmp/out', os.O_WRONLY | os.O_CREAT)
    n = 0
    try:
        while n < 1000:
            er, ew = os.pipe()
            _posixsubprocess.fork_exec(['/bin/sleep', '997'], [b'/bin/sleep'], True, (ew,), None, None, -1, -1, -1, out,
                                       -1, out, er, ew, False, False, -1, None, None, None, -1, None, False)
            os.close(er)
            os.close(ew)
            n += 1
            if n % 25 == 0:
                print('spawned', n, flush=True)  # the wall clock may end it before the last line
    except OSError as e:
        print('stopped', e.errno)
    print('spawned', n, flush=True)
""")
ZOMBIES = textwrap.dedent("""
    import ctypes, importlib.util, sys, psutil
    assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    if sys.argv[1]:
        spec = importlib.util.spec_from_file_location("sandbox_before", sys.argv[1])
        sb = importlib.util.module_from_spec(spec)
        sys.modules["sandbox_before"] = sb
        spec.loader.exec_module(sb)
    else:
        from crl_envs import sandbox as sb
    for i in range(15):
        sb.run_program("print(1)")
        sb.run_tests("def f(x):\\n    return x", "assert f(1) == 1")
    print(sum(p.status() == psutil.STATUS_ZOMBIE for p in psutil.Process().children()))
""")


def load_old_sandbox(rev: str) -> tuple[object, str]:
    source = subprocess.run(["git", "show", f"{rev}:crl_envs/sandbox.py"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="crl-old-sandbox-")) / "sandbox_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("sandbox_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_before"] = module
    spec.loader.exec_module(module)
    return module, str(path)


def measured(module, code: str, **limits) -> tuple[object, float]:
    """The result, and the largest drop of the host's available memory (MiB) while it ran."""
    base = psutil.virtual_memory().available
    lowest, done = [base], threading.Event()

    def sample():
        while not done.is_set():
            lowest[0] = min(lowest[0], psutil.virtual_memory().available)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = module.run_program(code, **limits)
    finally:
        done.set()
        sampler.join()
    return result, (base - lowest[0]) / (1 << 20)


def held(result) -> int:
    """MiB the program's processes said they held (each ``held N`` line is one process's N MiB)."""
    numbers = [int(line.split()[1]) for line in result.stdout_tail.splitlines() if line.startswith("held ")]
    return sum(numbers) if numbers else 0


def report(label: str, result, host_mib: float) -> None:
    peak = getattr(result, "memory_peak_mb", None)
    print(f"  {label:<22} status {result.status:<12} {result.seconds:5.1f} s  host -{host_mib:6.0f} MiB"
          + (f"  peak {peak:.0f} MiB" if peak is not None else "")
          + f"  | {' '.join(result.stdout_tail.split()[-6:])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", default="13ab484", help="git revision of the old sandbox")
    args = parser.parse_args()
    old, old_path = load_old_sandbox(args.before)
    print(f"after: {sandbox.isolation()}")
    print(f"before ({args.before}): {old.isolation()}")
    no_seccomp = dataclasses.replace(sandbox._boundary(False), seccomp=None)

    print("memfd: 100 x 15 MiB, memory_mb=256, tmpfs_mb=16")
    for label, module in (("before", old), ("after", sandbox)):
        report(label, *measured(module, MEMFD, memory_mb=256, tmpfs_mb=16, timeout=10))
    real = sandbox_run.require_boundary
    sandbox_run.require_boundary = lambda *a: no_seccomp  # the cgroup alone, seccomp off
    try:
        report("after, no seccomp", *measured(sandbox, MEMFD, memory_mb=256, tmpfs_mb=16, timeout=10))
    finally:
        sandbox_run.require_boundary = real

    print("10 processes x 400 MiB, default limits (memory_mb=1024, tmpfs_mb=64)")
    for label, module in (("before", old), ("after", sandbox)):
        result, host = measured(module, PROCESSES_400, timeout=30)
        report(f"{label} ({held(result)} MiB held)", result, host)

    print(f"CPU: 4 processes spinning 3 s each, on {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f})")
    for label, module in (("before", old), ("after", sandbox)):
        report(label, *measured(module, CPU, timeout=15))

    print("processes when bwrap runs as root (site_packages=True, interpreter under /root), max_processes=16")
    for label, module in (("before", old), ("after", sandbox)):
        report(label, *measured(module, FORK_LOOP, timeout=5, max_processes=16, site_packages=True))

    print("zombies left under PR_SET_CHILD_SUBREAPER after 15 run_program + 15 run_tests")
    for label, path in (("before", old_path), ("after", "")):
        out = subprocess.run([sys.executable, "-c", ZOMBIES, path], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()[-1]
        print(f"  {label:<22} {out}")


if __name__ == "__main__":
    main()
