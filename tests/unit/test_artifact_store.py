"""The artifact store's pure rules and its local-folder root (metarl/artifact_store.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from metarl.artifact_store import ArtifactStore, is_remote_root, local_root_path, manifest_of, safe_relative, split_ref
from metarl.errors import ArtifactMissing, ArtifactStoreNotShared


def test_roots_and_references() -> None:
    assert not is_remote_root(".metarl/artifacts") and not is_remote_root("file:///srv/a") and is_remote_root("s3://b/p")
    assert local_root_path("file:///srv/a") == Path("/srv/a")
    assert split_ref("s3://b/p/x.pt#sha256=ab12") == ("s3://b/p/x.pt", "ab12")
    assert split_ref("/srv/a/x.pt") == ("/srv/a/x.pt", None)


@pytest.mark.parametrize("path", ["a.txt", "d/e/f.jsonl"])
def test_safe_paths(path: str) -> None:
    assert safe_relative(path)


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a"])
def test_unsafe_paths(path: str) -> None:
    assert not safe_relative(path)


def test_manifest_lists_regular_files_not_links(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("hello")
    (tmp_path / "link").symlink_to("/etc/passwd")
    files = manifest_of(tmp_path)["files"]
    assert list(files) == ["d/a.txt"]
    assert files["d/a.txt"]["size"] == 5 and len(files["d/a.txt"]["sha256"]) == 64


def test_local_root_keeps_paths_and_copies_only_when_needed(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "root"), cache=tmp_path / "cache", host="a")
    inside = store.working_dir("workspaces/r/1/1/files")
    inside.mkdir(parents=True)
    (inside / "job.toml").write_text("x = 1\n")
    reference = store.put_tree(inside, "workspaces/r/1/1/files")
    assert reference == str(inside) and store.tree(reference) == inside
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "w.pt").write_bytes(b"\0\1")
    copied = store.put_file(outside / "w.pt", "policy/r/v00000.pt")
    assert Path(copied).read_bytes() == b"\0\1" and store.file(copied) == Path(copied)
    with pytest.raises(ArtifactMissing, match="missing on host a"):
        store.tree(str(tmp_path / "root" / "nothing"))


def test_local_root_refuses_a_host_that_does_not_share_it(tmp_path: Path) -> None:
    ArtifactStore(str(tmp_path / "host-a" / "artifacts"), host="a").mark_run("run-1")
    ArtifactStore(str(tmp_path / "host-a" / "artifacts"), host="a").check_shared("run-1")
    other = ArtifactStore(str(tmp_path / "host-b" / "artifacts"), host="b")
    with pytest.raises(ArtifactStoreNotShared, match=r"on a; host b does not share it.*s3://"):
        other.check_shared("run-1", ["a", "b"])
    assert not ArtifactStoreNotShared.retryable


def test_a_local_root_this_user_cannot_read_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_path: Path) -> bool:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "is_file", refuse)
    with pytest.raises(ArtifactStoreNotShared, match="cannot read run r1's local artifact root.*Permission denied.*read access"):
        ArtifactStore(str(tmp_path), host="a").check_shared("r1")
