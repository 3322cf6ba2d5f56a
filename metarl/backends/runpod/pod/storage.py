"""A folder in artifact storage on the pod (any fsspec URL: ``file://`` or a plain path in tests, ``s3://...`` on pods),
shared by the runner, the supervisor and the eval server. Standard library, pydantic-free, fsspec only."""

from __future__ import annotations

import os
from pathlib import Path


class Storage:
    """A folder in artifact storage (fsspec), addressed by relative paths."""

    def __init__(self, url: str):
        import fsspec

        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/")

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def url_of(self, relative: str) -> str:
        return f"{self.url}/{relative}"

    def read_bytes(self, relative: str) -> bytes:
        return self.fs.cat_file(self.path(relative))

    def write_bytes(self, relative: str, data: bytes) -> None:
        """Write one file; written to a temporary name first and moved, so readers never see half a file."""
        target = self.path(relative)
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        temporary = f"{target}.tmp-{os.getpid()}"
        self.fs.pipe_file(temporary, data)
        self.fs.mv(temporary, target)

    def upload_tree(self, local: Path, relative: str) -> list[str]:
        """Upload every file under ``local`` to ``relative``/...; returns the uploaded relative paths."""
        uploaded: list[str] = []
        if not local.is_dir():
            return uploaded
        for path in sorted(p for p in local.rglob("*") if p.is_file() and not p.is_symlink()):
            name = f"{relative}/{path.relative_to(local).as_posix()}"
            target = self.path(name)
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(path), target)
            uploaded.append(name)
        return uploaded
