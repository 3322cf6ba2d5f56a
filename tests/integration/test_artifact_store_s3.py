"""The artifact store on a real S3-compatible server (moto on 127.0.0.1): references, digests, caches and faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from metarl.artifact_store import MANIFEST, ArtifactStore
from metarl.errors import ArtifactMissing, ArtifactStoreUnavailable

pytestmark = pytest.mark.integration


def tree_with_files(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "job.toml").write_text('[model]\nname = "Qwen/Qwen3-0.6B"\n')
    (folder / "sub" / "dataset.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    return folder


def test_folders_and_files_round_trip_through_the_store_and_caches(tmp_path: Path, s3_bucket: str) -> None:
    writer = ArtifactStore(f"s3://{s3_bucket}/run", cache=tmp_path / "cache-a", host="a")
    reader = ArtifactStore(f"s3://{s3_bucket}/run", cache=tmp_path / "cache-b", host="b")
    source = tree_with_files(writer.working_dir("workspaces/r/1/1/files"))
    assert source.is_relative_to(tmp_path / "cache-a")
    reference = writer.put_tree(source, "workspaces/r/1/1/files")
    assert reference.startswith(f"s3://{s3_bucket}/run/workspaces/r/1/1/files#sha256=")
    copy = reader.tree(reference)
    assert copy.is_relative_to(tmp_path / "cache-b")
    assert (copy / "sub" / "dataset.jsonl").read_text() == (source / "sub" / "dataset.jsonl").read_text()
    assert reader.tree(reference) == copy  # cached by digest
    (tmp_path / "w.pt").write_bytes(b"weights")
    file_reference = writer.put_file(tmp_path / "w.pt", "policy/r/v00001-x.pt")
    assert reader.file(file_reference).read_bytes() == b"weights"


def test_a_changed_object_is_refused_by_its_digest(tmp_path: Path, s3_bucket: str) -> None:
    import fsspec

    store = ArtifactStore(f"s3://{s3_bucket}/run", cache=tmp_path / "cache", host="a")
    reference = store.put_tree(tree_with_files(tmp_path / "ws"), "workspaces/r/2/1/files")
    fs, _ = fsspec.core.url_to_fs(f"s3://{s3_bucket}")
    fs.pipe_file(f"{s3_bucket}/run/workspaces/r/2/1/files/job.toml", b"tampered = true\n")
    fresh = ArtifactStore(f"s3://{s3_bucket}/run", cache=tmp_path / "other-cache", host="b")
    with pytest.raises(ArtifactStoreUnavailable, match="does not match its reference's digest"):
        fresh.tree(reference)
    fs.pipe_file(f"{s3_bucket}/run/workspaces/r/2/1/files/{MANIFEST}", b"{}")
    with pytest.raises(ArtifactStoreUnavailable, match=MANIFEST):
        fresh.tree(reference)


def test_missing_and_unreachable_are_platform_faults(tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs

    store = ArtifactStore(f"s3://{s3_bucket}/run", cache=tmp_path / "cache", host="a")
    with pytest.raises(ArtifactMissing):
        store.file(f"s3://{s3_bucket}/run/policy/none.pt#sha256={'0' * 64}")
    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    try:
        with pytest.raises(ArtifactStoreUnavailable, match="cannot (read|write)"):
            ArtifactStore(f"s3://{s3_bucket}/run", cache=tmp_path / "cache2", host="a").put_bytes(b"x", "reports/r/index.html")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
