"""The sandbox's second round (issue 24): only the row's names come from the program, seccomp and a
cgroup cap memory that no rlimit counts, nothing is left for a subreaper, a venv under /tmp works,
a lone surrogate scores 0, and bad code-task options fail at load."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import psutil
import pytest

from crl_envs import tasks
from crl_envs.sandbox import isolation, run_program, run_tests
from crl_envs.tasks.code import HumanEvalTask, MBPPTask, called_names

pytestmark = pytest.mark.skipif(not isolation(), reason="needs bwrap (apt-get install bubblewrap)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A process started below the audit hook (as in the escape suite): only the kernel's limits hold it.
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
        for i in range(100):  # the issue's attack: 100 x 15 MiB of memfd pages, outside RLIMIT_AS and the tmpfs
            fd = os.memfd_create('x')
            os.write(fd, b'x' * (15 << 20))
            fds.append(fd)
            print('held', (i + 1) * 15, flush=True)
    except OSError as e:
        print('refused', e.errno, flush=True)
""")
VOLUME_TESTS = "assert math.isclose(volume_sphere(10), 4188.790204786391, rel_tol=0.001)"
FORGED = "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n\ndef volume_sphere(r):\n    return 0\n"
RIGHT = "import math\n\ndef volume_sphere(r):\n    return 4 / 3 * math.pi * r ** 3\n"
MBPP_ROW = {"task_id": 85, "text": "Write a function to find the volume of a sphere.", "code": RIGHT,
            "test_list": [VOLUME_TESTS], "test_setup_code": "", "challenge_test_list": []}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- 1. a forged pass through a name the tests never bind -------------------------------------------------


def test_an_answer_cannot_stand_in_for_a_standard_library_module(tmp_path):
    assert not run_tests(FORGED, VOLUME_TESTS).passed
    assert run_tests(RIGHT, VOLUME_TESTS).passed
    task = MBPPTask(path=_jsonl(tmp_path / "mbpp.jsonl", [MBPP_ROW]))
    assert task.program_names(task[0]) == ["volume_sphere"]
    assert task.score_many([f"```python\n{FORGED}```", f"```python\n{RIGHT}```"], [task[0]] * 2) == [0.0, 1.0]


def test_called_names_are_the_functions_the_row_asks_for():
    assert called_names("assert f(g(1), key=len) == np.x\nassert P(1).a == re.sub('a', 'b', 'a')") == ["P", "f", "g"]


# ---- 2. memory outside every rlimit: seccomp and the cgroup ---------------------------------------------------


@pytest.mark.parametrize("route", ["hooked", "unhooked"])
def test_memfd_create_is_refused_by_seccomp(route):
    code = MEMFD if route == "hooked" else SPAWN + f"os.waitpid(spawn([sys.executable, '-S', '-c', {MEMFD!r}]), 0)\n"
    result = run_program(code, timeout=10.0, memory_mb=256, tmpfs_mb=16)
    assert "refused 1" in result.stdout_tail and "held" not in result.stdout_tail  # EPERM at the first call
    assert result.memory_peak_mb is None or result.memory_peak_mb < 64


def test_memfd_through_default_humaneval_scoring_is_refused():
    task = HumanEvalTask(n=1)
    example = task[0]
    answer = f"{MEMFD}\ndef {example.metadata['entry_point']}(*args):\n    return None\n"
    result = task.run(answer, example)  # 1650 MiB held this way before
    assert not result.passed and "refused 1" in result.stdout_tail and "held" not in result.stdout_tail
    assert result.memory_peak_mb is None or result.memory_peak_mb < 64


APPLY_FILTER = textwrap.dedent("""
    import ctypes, importlib.util, os, socket, sys
    spec = importlib.util.spec_from_file_location("seccomp", sys.argv[1])  # the module alone, not the package
    seccomp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seccomp)
    program = seccomp.seccomp_program()
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    fprog = Fprog(len(program) // 8, program)
    assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, MODE_FILTER
    for call in (lambda: os.memfd_create("x"), lambda: socket.socket()):
        try:
            call()
            print("allowed")
        except PermissionError:
            print("refused")
    a, b = socket.socketpair()
    print("mode", libc.prctl(21, 0, 0, 0, 0), os.getpid() > 0, open(os.devnull).read() == "")
""")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter for this machine")
def test_the_seccomp_filter_itself_in_a_plain_process():
    done = subprocess.run([sys.executable, "-c", APPLY_FILTER, os.path.join(ROOT, "crl_envs", "sandbox", "seccomp.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused", "refused", "mode", "2", "True", "True"]


def test_seccomp_leaves_what_ordinary_programs_use():
    code = ("import asyncio, concurrent.futures, tempfile, mmap\n"
            "async def twice(x):\n    await asyncio.sleep(0)\n    return 2 * x\n"
            "assert asyncio.run(twice(2)) == 4\n"  # its event loop needs a socketpair
            "with concurrent.futures.ThreadPoolExecutor(2) as pool:\n    assert list(pool.map(abs, [-1, 2])) == [1, 2]\n"
            "with tempfile.TemporaryFile() as f:\n    f.write(b'x' * 4096)\n"
            "m = mmap.mmap(-1, 1 << 20)\nm[:1] = b'y'\n")
    result = run_program(code, timeout=10.0)
    assert result.passed, result.stdout_tail


def test_seccomp_is_on_in_the_sandboxed_process():
    inside = SPAWN + textwrap.dedent("""
        import ctypes
        os.waitpid(spawn([sys.executable, '-S', '-c', "import ctypes; print('mode', ctypes.CDLL(None).prctl(21, 0, 0, 0, 0))"]), 0)
        import time
        time.sleep(1.5)
    """)
    seen = {}

    def watch():  # from the host: /proc/PID/status of this test's sandboxed python processes
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not seen:
            for p in psutil.Process().children(recursive=True):
                try:
                    argv = p.cmdline()
                    if argv and "python" in os.path.basename(argv[0]) and "_load(_SOURCES)" in " ".join(argv):
                        with open(f"/proc/{p.pid}/status") as f:
                            seen.update(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
                except (psutil.Error, OSError):
                    pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = run_program(inside, timeout=10.0)
    watcher.join()
    assert "mode 2" in result.stdout_tail  # PR_GET_SECCOMP inside: 2 = a filter
    if "host uid 65534" in isolation():
        assert seen.get("Seccomp", "").strip() == "2" and seen.get("NoNewPrivs", "").strip() == "1", seen


# ---- 3. zombies under a subreaper ------------------------------------------------------------------------------

ZOMBIES = textwrap.dedent("""
    import ctypes, os, psutil
    assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER: orphans come to us
    from crl_envs.sandbox import run_program, run_tests
    for i in range(15):
        run_program("print(%d)" % i, timeout=5)
        run_tests("def f(x):\\n    return x", "assert f(%d) == %d" % (i, i % 2), timeout=5)
    print("zombies", sum(p.status() == psutil.STATUS_ZOMBIE for p in psutil.Process().children()))
""")


def test_nothing_is_left_for_a_subreaper_to_reap():
    done = subprocess.run([sys.executable, "-c", ZOMBIES], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["zombies", "0"]  # 46 before the library reaped its PID-namespace inits


# ---- 4. a lone surrogate ------------------------------------------------------------------------------------------


def test_a_lone_surrogate_scores_zero_and_never_raises(tmp_path):
    result = run_tests("def f():\n    return '\ud800'", "assert f() == 1")
    assert not result.passed and result.status == "failed" and "not valid UTF-8" in result.stdout_tail
    assert not run_program("print('\ud800')").passed
    mbpp = MBPPTask(path=_jsonl(tmp_path / "mbpp.jsonl", [MBPP_ROW]))
    assert mbpp.score_many([f"```python\n{RIGHT}# \ud800\n```", f"```python\n{RIGHT}```"], [mbpp[0]] * 2) == [0.0, 1.0]
    humaneval = HumanEvalTask(n=1)
    assert humaneval.score_many(["    return '\ud800'\n"], [humaneval[0]]) == [0.0]


# ---- 5. a venv under /tmp with site_packages=True ---------------------------------------------------------------------

VENV_CHECK = textwrap.dedent("""
    from crl_envs.sandbox import run_program, isolation
    print(isolation(site_packages=True))
    print(run_program("import numpy\\nassert numpy.arange(4).sum() == 6", timeout=20, site_packages=True).passed,
          run_program("import numpy", timeout=20).passed)
""")


def test_a_venv_under_tmp_runs_with_site_packages():
    venv = tempfile.mkdtemp(prefix="crl-venv-", dir="/tmp")
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv], check=True,
                       timeout=120)
        done = subprocess.run([os.path.join(venv, "bin", "python"), "-c", VENV_CHECK], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[0] == "bwrap" and done.stdout.split()[-2:] == ["True", "False"], done.stdout
    finally:
        subprocess.run(["rm", "-rf", venv], check=False)


def test_a_bwrap_that_cannot_start_is_named_with_its_own_error(tmp_path, monkeypatch):
    from crl_envs import sandbox

    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    sandbox._boundary.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match=r"bwrap is installed but could not start a sandbox here "
                                                             r"\(.*setting up uid map: Permission denied"):
            run_program("print(1)")
    finally:
        monkeypatch.undo()
        sandbox._boundary.cache_clear()
    assert run_program("print(1)").passed


# ---- 6. bad code-task options fail at load, in one line ------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, -1, "10"])
def test_code_task_timeout_must_be_positive_at_load(timeout):
    with pytest.raises(ValueError, match=r"^humaneval: the task option timeout= must be a positive number") as info:
        tasks.load("humaneval", timeout=timeout)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("entry", ["has close", "def", "", "f("])
def test_a_malformed_entry_point_names_its_row(tmp_path, entry):
    row = {"task_id": "HumanEval/7", "prompt": "def f(x):\n    \"\"\"x\"\"\"\n", "canonical_solution": "    return x\n",
           "test": "def check(candidate):\n    assert candidate(1) == 1\n", "entry_point": entry}
    with pytest.raises(ValueError, match=r"^humaneval row HumanEval/7: entry_point .* is not a Python function name")\
            as info:
        HumanEvalTask(path=_jsonl(tmp_path / "he.jsonl", [row]))
    assert "\n" not in str(info.value)
