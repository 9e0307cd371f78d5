"""A small seccomp filter for bwrap's ``--seccomp FD``: refuse the syscalls that hold kernel memory no
rlimit counts (``memfd_create``: its pages count against neither ``RLIMIT_AS`` nor the tmpfs size).

The filter is classic BPF, assembled here (no binding to libseccomp is needed); ``sock_filter`` is
``struct { u16 code; u8 jt; u8 jf; u32 k; }`` in native byte order, and the program reads
``struct seccomp_data`` (``nr`` at offset 0, ``arch`` at 4):

| step | instruction |
|---|---|
| 1 | load ``arch``; any other ABI than this machine's (e.g. i386 ``int 0x80`` on x86-64) kills the process |
| 2 | load ``nr``; on x86-64 the x32 ABI (``nr >= 0x40000000``) is refused |
| 3 | each refused syscall returns ``EPERM`` |
| 4 | everything else is allowed |
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# Classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_X32_SYSCALL_BIT = 0x40000000

# The refused syscalls: unbounded kernel memory (memfd_create, memfd_secret, SysV shm segments that
# outlive their mapping), and kernel attack surface that a scored program never needs (``socket``: there
# is no network in the sandbox anyway). ``socketpair`` stays (asyncio's event loop needs one); its
# buffers are bounded by RLIMIT_NOFILE.
REFUSED = ("memfd_create", "memfd_secret", "shmget", "socket", "userfaultfd", "io_uring_setup", "bpf", "perf_event_open",
           "add_key", "request_key", "keyctl")
# (AUDIT_ARCH_*, syscall numbers, whether the x32 bit exists) per machine (linux/audit.h, unistd tables).
_ARCHES = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "memfd_secret": 447, "shmget": 29, "socket": 41, "userfaultfd": 323,
                            "io_uring_setup": 425, "bpf": 321, "perf_event_open": 298, "add_key": 248,
                            "request_key": 249, "keyctl": 250}, True),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "memfd_secret": 447, "shmget": 194, "socket": 198, "userfaultfd": 282,
                             "io_uring_setup": 425, "bpf": 280, "perf_event_open": 241, "add_key": 217,
                             "request_key": 218, "keyctl": 219}, False),
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (default this one's), or ``None`` where it is not known."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    arch, numbers, x32 = _ARCHES[machine]
    refused = [numbers[name] for name in REFUSED]
    checks = len(refused) + (1 if x32 else 0)
    # Layout: [0] load arch, [1] arch check, [2] load nr, [3..3+checks) refusals, then ALLOW, ERRNO, KILL.
    allow = 3 + checks
    insns = [_insn(_LD_W_ABS, 4), _insn(_JEQ_K, arch, 0, allow), _insn(_LD_W_ABS, 0)]
    for i in range(checks):
        here = 3 + i
        to_errno = allow + 1 - (here + 1)
        if x32 and i == 0:
            insns.append(_insn(_JGE_K, _X32_SYSCALL_BIT, to_errno, 0))
        else:
            insns.append(_insn(_JEQ_K, refused[i - (1 if x32 else 0)], to_errno, 0))
    insns += [_insn(_RET_K, _RET_ALLOW), _insn(_RET_K, _RET_ERRNO | errno.EPERM), _insn(_RET_K, _RET_KILL_PROCESS)]
    return b"".join(insns)


def seccomp_fd(program: bytes) -> int:
    """A pipe's read end holding ``program`` (bwrap reads it to the end); the caller closes it."""
    r, w = os.pipe()
    try:
        os.write(w, program)  # a few hundred bytes: far below the pipe's buffer
    finally:
        os.close(w)
    return r
