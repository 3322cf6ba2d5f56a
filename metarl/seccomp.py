"""The seccomp filter of the sandbox: a classic BPF program, assembled here, that bubblewrap loads.

``filter_program(machine) -> bytes`` is the program for ``bwrap --seccomp FD`` (an array of
``struct sock_filter``, 8 bytes each, native byte order). It is a deny list of what a reward
function never needs; everything else is allowed, and the rlimits, namespaces and the audit hook
of :mod:`metarl.sandbox` bound the rest:

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

Only x86_64 and aarch64 are supported; the numbers below are those of the kernel's
``asm/unistd_64.h`` and ``asm-generic/unistd.h`` (``tests/unit/test_seccomp.py`` checks them
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


def instructions(machine: str) -> list[Instruction]:
    """The filter for ``machine`` as a list of instructions (see the module docstring)."""
    if machine not in SYSCALLS:
        raise UnsupportedMachine(f"no seccomp filter for machine {machine!r}; supported: {sorted(SYSCALLS)}")
    numbers = SYSCALLS[machine]
    program: list[Instruction] = [_ld(OFFSET_ARCH), _jeq(AUDIT_ARCH[machine], 1, 0), _ret(RET_KILL_PROCESS), _ld(OFFSET_NR)]
    if machine == "x86_64":
        program += [(JGE_K, 0, 1, X32_SYSCALL_BIT), _ret(RET_KILL_PROCESS)]
    for name in DENIED:
        if name in numbers:
            program += _block(numbers[name], [_ret(RET_KILL_PROCESS)])
    program += _block(numbers["socket"], [_ld(OFFSET_ARGS), _jeq(AF_UNIX, 0, 1), _ret(RET_ALLOW), _ret(RET_KILL_PROCESS)])
    program += _block(numbers["clone"], [_ld(OFFSET_ARGS), (JSET_K, 1, 0, CLONE_NAMESPACE_FLAGS), _ret(RET_ALLOW), _ret(RET_KILL_PROCESS)])
    program += _block(numbers["ioctl"], [_ld(OFFSET_ARGS + 8), _jeq(TIOCSTI, 2, 0), _jeq(TIOCLINUX, 1, 0), _ret(RET_ALLOW), _ret(RET_KILL_PROCESS)])
    program += _block(numbers["clone3"], [_ret(RET_ERRNO | errno.ENOSYS)])
    program.append(_ret(RET_ALLOW))
    return program


def encode(program: Iterable[Instruction]) -> bytes:
    """The instructions as ``struct sock_filter`` bytes (native byte order)."""
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def filter_program(machine: str) -> bytes:
    """The compiled filter for ``bwrap --seccomp`` on ``machine``; :class:`UnsupportedMachine` otherwise."""
    return encode(instructions(machine))
