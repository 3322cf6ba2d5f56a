"""Landlock for the ``process`` isolation level: the file-system wall the sandbox runner puts up around itself.

Landlock (Linux 5.13+) lets an unprivileged process take away its own access to the file system
and, from later ABI versions, TCP ports, abstract unix sockets and signals to processes outside it.
It needs no user namespace, only ``no_new_privs``, and once applied it cannot be lifted, whatever
code runs in the process afterwards. The runner makes the :func:`ruleset` before it drops root and
enforces it (:func:`restrict_self`) after its set-up, before the agent's code
(:mod:`metarl.sandbox_runner`), so the agent's code can read:

- the workspace (files and listings), its working directory;
- the standard library, entry by entry (its ``site-packages`` and ``dist-packages`` left out);
- a few single files: the interpreter, the runner, the graders and plugin grader files;

and nothing else: no other file or folder of the host can be opened, listed, written, created,
removed, linked, renamed, truncated or executed (open fails with ``EACCES``). What Landlock does
not govern (changing metadata: ``chmod``, ``chown``, times, extended attributes; System V IPC;
sockets by path; ``kill`` before ABI 6; ``prlimit`` on another process), the ``process`` level's
seccomp filter refuses (:func:`metarl.sandbox.seccomp.instructions` with ``own_pid``).

Standard library only (``ctypes``): the parent imports this module to ask the kernel for its ABI
(:func:`availability`), and the runner, which imports no metarl, loads this file by path.
System calls: ``landlock_create_ruleset`` (444), ``landlock_add_rule`` (445),
``landlock_restrict_self`` (446), the same numbers on x86_64 and aarch64.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
MACHINES = ("x86_64", "aarch64")
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# linux/landlock.h: file-system rights
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

KNOWN_ABI = 7
"""The newest ABI whose rights this module knows; a newer kernel is asked for these (it accepts them)."""
READ_FILE_RIGHTS = FS_READ_FILE
READ_DIR_RIGHTS = FS_READ_FILE | FS_READ_DIR
HIDDEN_NAMES = ("site-packages", "dist-packages")
"""Entries of the standard library folder that stay unreadable (installed packages, not the stdlib)."""


class LandlockError(OSError):
    """Landlock could not be applied (the message names the step and the kernel's error)."""


def handled_fs(abi: int) -> int:
    """Every file-system right ``abi`` knows: all of them are refused unless a rule grants them."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def handled_net(abi: int) -> int:
    """TCP rights (ABI 4+): none is granted, so no TCP bind or connect."""
    return NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0


def scoped(abi: int) -> int:
    """Scopes (ABI 6+): no abstract unix socket outside the sandbox, no signal to a process outside it."""
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def ruleset_attr(abi: int) -> bytes:
    """``struct landlock_ruleset_attr`` for ``abi`` (pure): 8, 16 or 24 bytes, as that ABI defines it."""
    fields = [handled_fs(abi)] + ([handled_net(abi)] if abi >= 4 else []) + ([scoped(abi)] if abi >= 6 else [])
    return struct.pack(f"={len(fields)}Q", *fields)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def availability() -> tuple[int, str | None]:
    """(the kernel's Landlock ABI version, None) or (0, why Landlock cannot be used and what to do)."""
    machine = os.uname().machine
    if machine not in MACHINES:
        return 0, f"no Landlock system call numbers for machine {machine!r} (supported: {', '.join(MACHINES)})"
    libc = _libc()
    version = libc.syscall(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_long(0), ctypes.c_long(CREATE_RULESET_VERSION))
    if version >= 1:
        return int(version), None
    code = ctypes.get_errno()
    if code == errno.EOPNOTSUPP:
        return 0, (
            f"Landlock is built into this kernel ({os.uname().release}) but not enabled: add landlock to the kernel's lsm= "
            "boot parameter (see /sys/kernel/security/lsm)"
        )
    if code == errno.ENOSYS:
        return 0, f"this kernel ({os.uname().release}) has no Landlock: it needs Linux 5.13 or newer built with CONFIG_SECURITY_LANDLOCK=y"
    return 0, f"the Landlock ABI query failed: {os.strerror(code) if code else 'unknown error'}"


def folder_entries(folder: str, hidden: tuple[str, ...] = HIDDEN_NAMES) -> tuple[list[str], list[str]]:
    """(sub-folders, files) directly in ``folder`` but ``hidden`` and symbolic links: the rules that grant a
    folder without some of its entries (Landlock grants whole trees)."""
    folders: list[str] = []
    files: list[str] = []
    for entry in sorted(os.scandir(folder), key=lambda item: item.name):
        if entry.name in hidden or entry.is_symlink():
            continue
        (folders if entry.is_dir(follow_symlinks=False) else files).append(entry.path)
    return folders, files


def ruleset(read_dirs: list[str], read_files: list[str]) -> int:
    """A Landlock ruleset (its fd) that allows reading beneath ``read_dirs`` and the ``read_files``, and nothing else
    of the file system; from ABI 4 no TCP, from ABI 6 no abstract unix socket or signal outside the sandbox.

    Made before a privilege drop (the paths are opened here, which the dropped uid may not be allowed
    to do); :func:`restrict_self` enforces it. A path that does not exist is skipped (nothing to
    grant). Raises :class:`LandlockError` when any step fails (the caller fails closed).
    """
    abi, problem = availability()
    if problem is not None:
        raise LandlockError(errno.EOPNOTSUPP, problem)
    abi = min(abi, KNOWN_ABI)
    libc = _libc()
    raw = ruleset_attr(abi)
    attr = ctypes.create_string_buffer(raw, len(raw))
    fd = libc.syscall(ctypes.c_long(SYS_CREATE_RULESET), attr, ctypes.c_long(len(raw)), ctypes.c_long(0))
    if fd < 0:
        code = ctypes.get_errno()
        raise LandlockError(code, f"landlock_create_ruleset failed: {os.strerror(code)}")
    try:
        for path, rights in [*((path, READ_DIR_RIGHTS) for path in read_dirs), *((path, READ_FILE_RIGHTS) for path in read_files)]:
            _add_rule(libc, int(fd), path, rights)
    except BaseException:
        os.close(int(fd))
        raise
    return int(fd)


def restrict_self(ruleset_fd: int) -> None:
    """Enforce a :func:`ruleset` on this process and all it starts, then close it. Sets ``no_new_privs`` first
    (Landlock requires it). Irreversible; raises :class:`LandlockError` when the kernel refuses."""
    libc = _libc()
    try:
        if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            code = ctypes.get_errno()
            raise LandlockError(code, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(code)}")
        if libc.syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_long(ruleset_fd), ctypes.c_long(0)) != 0:
            code = ctypes.get_errno()
            raise LandlockError(code, f"landlock_restrict_self failed: {os.strerror(code)}")
    finally:
        os.close(ruleset_fd)


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= READ_FILE_RIGHTS  # a rule on a file takes file rights only
        beneath = _PathBeneath(allowed_access=rights, parent_fd=fd)
        if libc.syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_long(ruleset), ctypes.c_long(RULE_PATH_BENEATH), ctypes.byref(beneath), ctypes.c_long(0)) != 0:
            code = ctypes.get_errno()
            raise LandlockError(code, f"landlock_add_rule for {path} failed: {os.strerror(code)}")
    finally:
        os.close(fd)
