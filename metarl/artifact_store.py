"""The artifact store: every file that crosses a stage or a process (workspaces, job folders, checkpoints, policy states,
reports) goes through it.

The root is a local folder (one host, or a folder every host mounts at the same path) or any fsspec URL
(`s3://bucket/prefix` with `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`). Under a local root an
artifact's reference is its path, as it always was. Under a URL a reference is `URL#sha256=DIGEST`: a file's digest, or
for a folder the digest of its `MANIFEST.json` (each file's path, size and digest), which is written last. Readers keep
only a cache (`metarl.settings.cache_dir`), filled from the store and checked against the digests, and hand out local
copies from it.

Store failures are platform faults (`metarl.errors`), never the agent's: the stages retry them, then pause the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metarl import settings
from metarl.errors import ArtifactMissing, ArtifactStoreNotShared, ArtifactStoreUnavailable

MANIFEST = "MANIFEST.json"
DIGEST_MARK = "#sha256="
COMPLETE_MARK = ".complete"
RUN_MARKER = "HOST"
SHARED_STORE_FIX = (
    'use a store every host reaches: [artifacts] root = "s3://BUCKET/PREFIX" with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and '
    "AWS_SECRET_ACCESS_KEY set on every host (docs/operations.md, several hosts), or a shared folder mounted at the same path on every host"
)


def store_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a store call may raise for an unreachable or refusing store (botocore's only where it is installed)."""
    try:
        from botocore.exceptions import BotoCoreError
    except ImportError:
        return (OSError, TimeoutError)
    return (OSError, TimeoutError, BotoCoreError)


def is_remote_root(root: str) -> bool:
    """True for an fsspec URL other than `file://`; a plain path or `file://` URL is a local folder."""
    return "://" in root and not root.startswith("file://")


def local_root_path(root: str) -> Path:
    """The folder of a local root (`file://` stripped); relative roots are relative to the process's working folder."""
    return Path(root[len("file://") :] if root.startswith("file://") else root)


def split_ref(ref: str) -> tuple[str, str | None]:
    """(URL, digest) of a reference; digest None for a plain local path."""
    url, mark, digest = ref.partition(DIGEST_MARK)
    return (url, digest) if mark else (ref, None)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_of(folder: Path) -> dict[str, Any]:
    """Each regular file under `folder` (links are not followed, nor stored) by its relative path: size and digest."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        relative = path.relative_to(folder).as_posix()
        if relative == MANIFEST:
            continue
        files[relative] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    return {"format": 1, "files": files}


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def safe_relative(relative: str) -> bool:
    """A manifest path that stays inside its folder."""
    parts = relative.split("/")
    return bool(relative) and not relative.startswith("/") and all(part not in ("", ".", "..") for part in parts)


class ArtifactStore:
    """One run's artifact store; see the module docstring."""

    def __init__(self, root: str, *, cache: Path | None = None, host: str | None = None):
        self.root = root
        self.remote = is_remote_root(root)
        self.cache = cache if cache is not None else settings.cache_dir() / "artifacts"
        self.host = host if host is not None else settings.host_name()
        self._fs: Any = None
        self._base = ""

    # --- where things are -------------------------------------------------------------------------------------------

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            import fsspec

            try:
                self._fs, base = fsspec.core.url_to_fs(self.root)
            except (ValueError, ImportError) as err:
                raise ArtifactStoreUnavailable(f"artifacts root {self.root!r}: {err}") from None
            self._base = base.rstrip("/")
        return self._fs, self._base

    def _remote_path(self, key: str) -> str:
        _fs, base = self._filesystem()
        return f"{base}/{key.strip('/')}"

    def url(self, key: str) -> str:
        """The URL (remote) or path (local) of `key` under the root."""
        if self.remote:
            return f"{self.root.rstrip('/')}/{key.strip('/')}"
        return str(local_root_path(self.root) / key)

    def working_dir(self, key: str) -> Path:
        """A local folder to build the artifact `key` in before it is stored: its own place under a local root, a
        scratch folder in this host's cache under a URL (the caller removes it once stored)."""
        if not self.remote:
            return local_root_path(self.root) / key
        return self.cache / "scratch" / key.strip("/")

    # --- runs and hosts ---------------------------------------------------------------------------------------------

    def mark_run(self, run_id: str) -> None:
        """Record under a local root which host created the run, so other hosts can tell whether they share the folder."""
        if self.remote:
            return
        marker = local_root_path(self.root) / "runs" / run_id / RUN_MARKER
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(self.host + "\n", encoding="utf-8")

    def check_shared(self, run_id: str, known_hosts: list[str] | None = None) -> None:
        """Raise ArtifactStoreNotShared when this host does not see the run's local root (its marker is missing)."""
        if self.remote:
            return
        marker = local_root_path(self.root) / "runs" / run_id / RUN_MARKER
        try:
            if marker.is_file():
                return
        except PermissionError as err:
            raise ArtifactStoreNotShared(
                f"host {self.host} cannot read run {run_id}'s local artifact root {self.root!r} ({err.strerror}): give this worker's user "
                f"read access to it (the workspaces, checkpoints and policy states are there), or {SHARED_STORE_FIX}"
            ) from None
        others = ", ".join(host for host in (known_hosts or []) if host != self.host) or "another host"
        raise ArtifactStoreNotShared(
            f"run {run_id} keeps its artifacts in the local folder {self.root!r} on {others}; host {self.host} does not share it "
            f"(no {marker}): {SHARED_STORE_FIX}"
        )

    # --- folders ----------------------------------------------------------------------------------------------------

    def put_tree(self, folder: Path, key: str) -> str:
        """Store the regular files of `folder` as `key` (under a local root, a folder already in it stays where it is);
        return the reference readers pass to `tree`."""
        if not self.remote:
            if self._inside_local_root(folder):
                return str(folder)
            target = local_root_path(self.root) / key
            shutil.copytree(folder, target, dirs_exist_ok=True)
            return str(target)
        manifest = manifest_of(folder)
        data = manifest_bytes(manifest)

        def write(fs: Any, prefix: str) -> None:
            for relative in manifest["files"]:
                fs.put_file(str(folder / relative), f"{prefix}/{relative}")
            fs.pipe_file(f"{prefix}/{MANIFEST}", data)

        return self._write_remote(key, hashlib.sha256(data).hexdigest(), write)

    def tree(self, ref: str) -> Path:
        """A local folder holding the stored folder `ref`: the folder itself under a local root, else a verified cached copy."""
        url, digest = split_ref(ref)
        if digest is None:
            return self._local_artifact(url, folder=True)
        target = self.cache / "trees" / digest
        if (target / COMPLETE_MARK).is_file():
            return target
        manifest_data = self._read_remote(f"{url}/{MANIFEST}")
        if hashlib.sha256(manifest_data).hexdigest() != digest:
            raise ArtifactStoreUnavailable(f"{url}/{MANIFEST} does not match its reference's digest (changed after it was stored?)")
        files = json.loads(manifest_data)["files"]
        staging = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=self._ensure(self.cache / "trees")))
        try:
            for relative, info in files.items():
                if not safe_relative(relative):
                    raise ArtifactStoreUnavailable(f"{url}/{MANIFEST} names a path outside its folder: {relative!r}")
                blob = self._blob(f"{url}/{relative}", str(info["sha256"]))
                destination = staging.joinpath(*relative.split("/"))
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(blob, destination)
            (staging / COMPLETE_MARK).write_text(digest, encoding="utf-8")
            try:
                staging.rename(target)
            except OSError:
                if not (target / COMPLETE_MARK).is_file():  # another process made it first; else a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    # --- single files -----------------------------------------------------------------------------------------------

    def put_file(self, path: Path, key: str) -> str:
        """Store one file as `key`; return its reference."""
        if not self.remote:
            if self._inside_local_root(path):
                return str(path)
            target = local_root_path(self.root) / key
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            return str(target)
        return self._write_remote(key, sha256_of(path), lambda fs, remote: fs.put_file(str(path), remote))

    def file(self, ref: str) -> Path:
        """A local path holding the stored file `ref`: the file itself under a local root, else a verified cached copy."""
        url, digest = split_ref(ref)
        if digest is None:
            return self._local_artifact(url, folder=False)
        return self._blob(url, digest)

    def put_bytes(self, data: bytes, key: str) -> str:
        """Store `data` as `key`; return its reference."""
        if not self.remote:
            target = local_root_path(self.root) / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            return str(target)
        return self._write_remote(key, hashlib.sha256(data).hexdigest(), lambda fs, remote: fs.pipe_file(remote, data))

    # --- internals --------------------------------------------------------------------------------------------------

    def _write_remote(self, key: str, digest: str, write: Callable[[Any, str], None]) -> str:
        """Run ``write(filesystem, remote path of key)``; the reference to `key` with `digest`, or
        ArtifactStoreUnavailable naming the URL when the store refuses or cannot be reached."""
        fs, _base = self._filesystem()
        try:
            write(fs, self._remote_path(key))
        except store_errors() as err:
            raise ArtifactStoreUnavailable(f"cannot write {self.url(key)}: {err}") from None
        return f"{self.url(key)}{DIGEST_MARK}{digest}"

    def _inside_local_root(self, path: Path) -> bool:
        """True when `path` already lies in the local root: it is stored where it is (its path is its reference)."""
        return path.resolve().is_relative_to(local_root_path(self.root).resolve())

    def _local_artifact(self, path_text: str, *, folder: bool) -> Path:
        """An artifact of a local root where it lies; ArtifactMissing when it is not there."""
        path = local_root_path(path_text)
        if not (path.is_dir() if folder else path.is_file()):
            raise ArtifactMissing(f"artifact {'folder ' if folder else ''}{path_text} is missing on host {self.host}")
        return path

    @staticmethod
    def _ensure(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    @staticmethod
    def _filesystem_of(url: str) -> tuple[Any, str]:
        """The fsspec filesystem and path of a stored artifact's URL (a reference is read without knowing the run's root)."""
        import fsspec

        try:
            return fsspec.core.url_to_fs(url)
        except (ValueError, ImportError) as err:
            raise ArtifactStoreUnavailable(f"cannot read {url}: {err}") from None

    def _read_remote(self, url: str) -> bytes:
        fs, path = self._filesystem_of(url)
        try:
            return bytes(fs.cat_file(path))
        except FileNotFoundError:
            raise ArtifactMissing(f"artifact {url} is not in the store") from None
        except store_errors() as err:
            raise ArtifactStoreUnavailable(f"cannot read {url}: {err}") from None

    def _blob(self, url: str, digest: str) -> Path:
        """The cached copy of the stored file `url` whose content has `digest`, downloaded and checked when not cached."""
        blobs = self._ensure(self.cache / "blobs")
        blob = blobs / digest
        if blob.is_file():
            return blob
        fs, path = self._filesystem_of(url)
        partial = blobs / f".{digest}.{uuid.uuid4().hex[:8]}"
        try:
            fs.get_file(path, str(partial))
        except FileNotFoundError:
            partial.unlink(missing_ok=True)
            raise ArtifactMissing(f"artifact {url} is not in the store") from None
        except store_errors() as err:
            partial.unlink(missing_ok=True)
            raise ArtifactStoreUnavailable(f"cannot read {url}: {err}") from None
        if sha256_of(partial) != digest:
            partial.unlink(missing_ok=True)
            raise ArtifactStoreUnavailable(f"{url} does not match its reference's digest (changed after it was stored?)")
        os.replace(partial, blob)
        return blob
