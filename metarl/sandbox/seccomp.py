"""The seccomp filter of the sandbox: a classic BPF program, assembled here, that bubblewrap loads.

``filter_program(machine) -> bytes`` is the program for ``bwrap --seccomp FD`` (an array of
``struct sock_filter``, 8 bytes each, native byte order). It is a deny list of what a reward
function never needs; everything else is allowed, and the rlimits, namespaces and the audit hook
of :mod:`metarl.sandbox.parent` bound the rest:

- a system call of another ABI (i386 through ``int 0x80``, x32) kills the process;
- the calls in :data:`DENIED` kill the process (``SECCOMP_RET_KILL_PROCESS``, seen by the parent
  as SIGSYS and reported as ``forbidden``): device and FIFO nodes (``mknod``, ``mknodat``), other
  processes (``ptrace``, ``process_vm_*``, ``pidfd_*``, ``kcmp``), mounts and namespaces,
  keyrings, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring``, file handles, kernel
  modules and ``kexec``, ``personality``, anonymous memory files, and host administration;
- ``socket`` for any family but ``AF_UNIX``, ``clone`` with a namespace flag, and the terminal
  injection ``ioctl`` requests (``TIOCSTI``, ``TIOCLINUX``) kill the process;
- ``clone3`` fails with ``ENOSYS`` (its flags sit behind a pointer a filter cannot read), so the C
  library falls back to ``clone``, whose flags are checked.

Level ``process`` (:func:`instructions` with ``own_pid``: no namespace hides the host's processes,
sockets and IPC there, and Landlock governs file access but not metadata) adds, for the runner
whose pid is ``own_pid``:

- every ``socket`` and ``socketpair`` kills the process (no unix socket of the host by path or by
  abstract name, no network);
- :data:`PROCESS_DENIED` kills the process: System V IPC, POSIX message queues, metadata changes
  that Landlock does not govern (``chmod``, ``chown``, file times, extended attributes, ``truncate``
  by path), ``inotify_add_watch``, ``process_madvise`` and ``process_mrelease``;
- calls that name another process by pid (:data:`OWN_PID_CALLS`: ``kill``, ``tkill``, ``tgkill``,
  ``rt_sigqueueinfo``, ``rt_tgsigqueueinfo``, ``prlimit64``, the ``sched_set*`` calls,
  ``get_robust_list``; ``setpriority`` and ``ioprio_set`` for one process) kill the process unless
  the pid is 0 or ``own_pid`` (its own process group is itself alone: it runs in a new session and
  cannot fork);
- ``fcntl`` ``F_SETOWN``/``F_SETOWN_EX`` (signals on I/O to a chosen process) and ``F_SETLEASE``,
  ``prctl(PR_SET_PDEATHSIG)`` (the runner set it; it stays) and the ``ioctl`` requests that set
  file flags or a signal owner kill the process;
- every system call numbered :data:`FIRST_UNVETTED` or above fails with ``ENOSYS`` (calls newer
  than this list, such as ``fchmodat2`` and ``setxattrat``; the C library falls back).

Only x86_64 and aarch64 are supported; the numbers below are those of the kernel's
``asm/unistd_64.h`` and ``asm-generic/unistd.h`` (``tests/unit/test_isolation.py`` checks them
against the headers when they are installed).
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterable

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
OFFSET_NR = 0
OFFSET_ARCH = 4
OFFSET_ARGS = 16

# classic BPF opcodes (linux/filter.h)
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06

RET_KILL_PROCESS = 0x80000000
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

AF_UNIX = 1
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
CLONE_NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET."""

DENIED = (
    # device, FIFO and socket nodes
    "mknod", "mknodat",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "kcmp",
    "move_pages", "migrate_pages",
    # mounts and namespaces
    "mount", "umount2", "pivot_root", "chroot", "mount_setattr", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "unshare", "setns",
    # kernel interfaces a reward never needs
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "open_by_handle_at", "name_to_handle_at", "memfd_create", "memfd_secret", "personality",
    "fanotify_init", "lookup_dcookie", "uselib", "ustat", "sysfs", "_sysctl", "modify_ldt", "iopl", "ioperm",
    # kernel modules, kexec and host administration
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module",
    "get_kernel_syms", "query_module", "nfsservctl", "acct", "swapon", "swapoff", "reboot", "sethostname",
    "setdomainname", "syslog", "quotactl", "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "vhangup",
)  # fmt: skip
"""System calls that kill the sandboxed process."""

PROCESS_DENIED = (
    # sockets of every family (the full level has its own network namespace and no host sockets to reach)
    "socket", "socketpair",
    # System V IPC and POSIX message queues (no IPC namespace at this level)
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv",
    "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    # metadata of files that Landlock does not govern
    "chmod", "fchmod", "fchmodat", "chown", "fchown", "lchown", "fchownat", "utime", "utimes", "futimesat", "utimensat",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "truncate", "inotify_add_watch",
    # other processes' memory
    "process_madvise", "process_mrelease",
)  # fmt: skip
"""System calls that also kill the process at level ``process`` (no namespaces there)."""

OWN_PID_CALLS = (
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "prlimit64", "sched_setaffinity",
    "sched_setscheduler", "sched_setparam", "sched_setattr", "get_robust_list",
)  # fmt: skip
"""Calls whose first argument is a pid: at level ``process`` only 0 (itself, or its own process group) or its own pid."""

PRIO_PROCESS = 0
IOPRIO_WHO_PROCESS = 1
PR_SET_PDEATHSIG = 1
FCNTL_DENIED = (8, 15, 1024)
"""F_SETOWN, F_SETOWN_EX (a chosen process gets SIGIO), F_SETLEASE (others' opens of the file block)."""
IOCTL_DENIED = (TIOCSTI, TIOCLINUX)
PROCESS_IOCTL_DENIED = (0x40086602, 0x40046602, 0x401C5820, 0x8901, 0x8902, 0x5410)
"""FS_IOC_SETFLAGS (and its 32-bit form), FS_IOC_FSSETXATTR, FIOSETOWN, SIOCSPGRP, TIOCSPGRP."""
FIRST_UNVETTED = 449
"""Calls from this number on (``futex_waitv`` and newer: ``fchmodat2``, ``setxattrat``, ``file_setattr``...)
fail with ENOSYS at level ``process``; the same number on x86_64 and aarch64."""

SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "ioctl": 16, "socket": 41, "clone": 56, "ptrace": 101, "syslog": 103, "mknod": 133, "uselib": 134,
        "personality": 135, "ustat": 136, "sysfs": 139, "vhangup": 153, "modify_ldt": 154, "pivot_root": 155,
        "_sysctl": 156, "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165,
        "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
        "iopl": 172, "ioperm": 173, "create_module": 174, "init_module": 175, "delete_module": 176,
        "get_kernel_syms": 177, "query_module": 178, "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212,
        "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
        "migrate_pages": 256, "mknodat": 259, "unshare": 272, "move_pages": 279, "perf_event_open": 298,
        "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305,
        "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
        "memfd_create": 319, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "pidfd_send_signal": 424,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434,
        "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443, "memfd_secret": 447,
        # level process
        "shmget": 29, "shmat": 30, "shmctl": 31, "socketpair": 53, "kill": 62, "semget": 64, "semop": 65,
        "semctl": 66, "shmdt": 67, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "fcntl": 72,
        "truncate": 76, "chmod": 90, "fchmod": 91, "chown": 92, "fchown": 93, "lchown": 94, "rt_sigqueueinfo": 129,
        "utime": 132, "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144, "prctl": 157,
        "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
        "fremovexattr": 199, "tkill": 200, "sched_setaffinity": 203, "semtimedop": 220, "tgkill": 234, "utimes": 235,
        "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
        "mq_getsetattr": 245, "ioprio_set": 251, "inotify_add_watch": 254, "fchownat": 260, "futimesat": 261,
        "fchmodat": 268, "get_robust_list": 274, "utimensat": 280, "rt_tgsigqueueinfo": 297, "prlimit64": 302,
        "sched_setattr": 314, "process_madvise": 440, "process_mrelease": 448,
    },
    "aarch64": {
        "lookup_dcookie": 18, "ioctl": 29, "mknodat": 33, "umount2": 39, "mount": 40, "pivot_root": 41,
        "nfsservctl": 42, "chroot": 51, "vhangup": 58, "quotactl": 60, "acct": 89, "personality": 92,
        "unshare": 97, "kexec_load": 104, "init_module": 105, "delete_module": 106, "clock_settime": 112,
        "syslog": 116, "ptrace": 117, "reboot": 142, "sethostname": 161, "setdomainname": 162,
        "settimeofday": 170, "adjtimex": 171, "socket": 198, "add_key": 217, "request_key": 218, "keyctl": 219,
        "clone": 220, "swapon": 224, "swapoff": 225, "migrate_pages": 238, "move_pages": 239,
        "perf_event_open": 241, "fanotify_init": 262, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "finit_module": 273, "memfd_create": 279, "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294,
        "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
        "memfd_secret": 447,
        # level process
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16,
        "fcntl": 25, "inotify_add_watch": 27, "ioprio_set": 30, "truncate": 45, "fchmod": 52, "fchmodat": 53,
        "fchownat": 54, "fchown": 55, "utimensat": 88, "get_robust_list": 100, "sched_setparam": 118,
        "sched_setscheduler": 119, "sched_setaffinity": 122, "kill": 129, "tkill": 130, "tgkill": 131,
        "rt_sigqueueinfo": 138, "setpriority": 140, "prctl": 167, "mq_open": 180, "mq_unlink": 181,
        "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185, "msgget": 186,
        "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191, "semtimedop": 192, "semop": 193,
        "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197, "socketpair": 199, "rt_tgsigqueueinfo": 240,
        "prlimit64": 261, "sched_setattr": 274, "process_madvise": 440, "process_mrelease": 448,
    },
}  # fmt: skip
"""System call numbers per machine (``uname -m``); a name a machine lacks is simply absent."""

Instruction = tuple[int, int, int, int]
"""One ``struct sock_filter``: (code, jump if true, jump if false, k)."""


class UnsupportedMachine(ValueError):
    """No seccomp filter is defined for this machine."""


def _ld(offset: int) -> Instruction:
    return (LD_W_ABS, 0, 0, offset)


def _ret(value: int) -> Instruction:
    return (RET_K, 0, 0, value)


def _jeq(value: int, true: int, false: int) -> Instruction:
    return (JEQ_K, true, false, value)


def _block(nr: int, body: list[Instruction]) -> list[Instruction]:
    """``if nr == N: body`` (the body ends in returns on every path), else fall through."""
    return [_jeq(nr, 0, len(body)), *body]


def _one_of(offset: int, values: tuple[int, ...], then: int, otherwise: int) -> list[Instruction]:
    """``return then if args-word at offset in values else otherwise``."""
    tests = [_jeq(value, len(values) - index, 0) for index, value in enumerate(values)]
    return [_ld(offset), *tests, _ret(otherwise), _ret(then)]


def _one_process(which: int, pids: tuple[int, ...]) -> list[Instruction]:
    """For ``call(which, who, ...)``: allow only ``which`` (one process, not a group or a user) with ``who`` in ``pids``."""
    return [_ld(_arg(0)), _jeq(which, 1, 0), _ret(RET_KILL_PROCESS), *_one_of(_arg(1), pids, RET_ALLOW, RET_KILL_PROCESS)]


def _arg(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` (little-endian machines; the kernel reads an int argument from them)."""
    return OFFSET_ARGS + 8 * index


def instructions(machine: str, own_pid: int | None = None) -> list[Instruction]:
    """The filter for ``machine`` as a list of instructions (see the module docstring); with ``own_pid``, the
    stricter filter of level ``process`` for the process of that pid."""
    if machine not in SYSCALLS:
        raise UnsupportedMachine(f"no seccomp filter for machine {machine!r}; supported: {sorted(SYSCALLS)}")
    numbers = SYSCALLS[machine]
    program: list[Instruction] = [_ld(OFFSET_ARCH), _jeq(AUDIT_ARCH[machine], 1, 0), _ret(RET_KILL_PROCESS), _ld(OFFSET_NR)]
    if machine == "x86_64":
        program += [(JGE_K, 0, 1, X32_SYSCALL_BIT), _ret(RET_KILL_PROCESS)]
    process = own_pid is not None
    if process:
        program += [(JGE_K, 0, 1, FIRST_UNVETTED), _ret(RET_ERRNO | errno.ENOSYS)]
    for name in DENIED + (PROCESS_DENIED if process else ()):
        if name in numbers:
            program += _block(numbers[name], [_ret(RET_KILL_PROCESS)])
    if not process:
        program += _block(numbers["socket"], [_ld(OFFSET_ARGS), _jeq(AF_UNIX, 0, 1), _ret(RET_ALLOW), _ret(RET_KILL_PROCESS)])
    program += _block(numbers["clone"], [_ld(OFFSET_ARGS), (JSET_K, 1, 0, CLONE_NAMESPACE_FLAGS), _ret(RET_ALLOW), _ret(RET_KILL_PROCESS)])
    ioctls = IOCTL_DENIED + (PROCESS_IOCTL_DENIED if process else ())
    program += _block(numbers["ioctl"], _one_of(_arg(1), ioctls, RET_KILL_PROCESS, RET_ALLOW))
    program += _block(numbers["clone3"], [_ret(RET_ERRNO | errno.ENOSYS)])
    if own_pid is not None:
        mine = (0, own_pid)
        for name in OWN_PID_CALLS:
            program += _block(numbers[name], _one_of(_arg(0), mine, RET_ALLOW, RET_KILL_PROCESS))
        program += _block(numbers["setpriority"], _one_process(PRIO_PROCESS, mine))
        program += _block(numbers["ioprio_set"], _one_process(IOPRIO_WHO_PROCESS, mine))
        program += _block(numbers["fcntl"], _one_of(_arg(1), FCNTL_DENIED, RET_KILL_PROCESS, RET_ALLOW))
        program += _block(numbers["prctl"], _one_of(_arg(0), (PR_SET_PDEATHSIG,), RET_KILL_PROCESS, RET_ALLOW))
    program.append(_ret(RET_ALLOW))
    return program


def encode(program: Iterable[Instruction]) -> bytes:
    """The instructions as ``struct sock_filter`` bytes (native byte order)."""
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def filter_program(machine: str, own_pid: int | None = None) -> bytes:
    """The compiled filter for ``bwrap --seccomp`` on ``machine`` (with ``own_pid``: level ``process``'s filter for that
    process, see :func:`install`); :class:`UnsupportedMachine` otherwise."""
    return encode(instructions(machine, own_pid))


PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def install(program: bytes) -> None:
    """Load ``program`` as a seccomp filter on the calling thread (level ``process``: the runner on itself, after
    ``no_new_privs``; irreversible, inherited by everything it starts). Raises OSError when the kernel refuses."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_SECCOMP) failed: {errno.errorcode.get(code, code)}")
