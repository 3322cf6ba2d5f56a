"""Issue 40, item 6: a task spec's data files must be regular files, and their size is enforced while
reading, not taken from st_size: `[items] pool = "/dev/zero"` and a FIFO are refused at once, naming the
spec field and the fix, instead of eating memory or blocking forever."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from metarl.learning.data_families import DataFileError, read_items, read_regular_file
from metarl.runconfig import load_task_spec
from schemas.base import ConfigError

CAPITALS = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "capitals"


def spec_with(tmp_path: Path, pool: str | None = None, hidden: str | None = None) -> Path:
    folder = tmp_path / "specs"
    shutil.copytree(CAPITALS, folder)
    path = folder / "capitals.toml"
    text = path.read_text()
    if pool is not None:
        text = text.replace('pool = "data/train.jsonl"', f'pool = "{pool}"')
    if hidden is not None:
        text = text.replace('path = "data/hidden.jsonl"', f'path = "{hidden}"')
    path.write_text(text)
    return path


def refused_fields(path: Path) -> dict[str, tuple[str, str]]:
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_task_spec(path)
    assert time.monotonic() - started < 10, "refusing a data file took too long"
    return {problem.field: (problem.message, problem.fix) for problem in info.value.problems}


def test_a_device_as_the_pool_is_refused_without_reading_it(tmp_path: Path) -> None:
    found = refused_fields(spec_with(tmp_path, pool="/dev/zero"))
    message, fix = found["items.pool"]
    assert "/dev/zero is a device, not a regular file" in message and "regular" in fix


def test_a_fifo_as_the_hidden_eval_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "hidden.fifo"
    os.mkfifo(fifo)
    found = refused_fields(spec_with(tmp_path, hidden=str(fifo)))
    message, fix = found["hidden_eval.path"]
    assert "is a FIFO, not a regular file" in message and "regular" in fix


def test_a_socket_and_a_folder_are_refused(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        with pytest.raises(DataFileError, match="is a socket"):
            read_regular_file(tmp_path / "sock", "sock")
    with pytest.raises(DataFileError, match="is a folder"):
        read_regular_file(tmp_path, "data")


def test_the_size_cap_counts_the_bytes_read_not_st_size(tmp_path: Path) -> None:
    path = tmp_path / "pool.jsonl"
    path.write_bytes(b"x" * 11)
    assert read_regular_file(path, "pool.jsonl", max_bytes=11) == b"x" * 11
    with pytest.raises(DataFileError) as info:
        read_regular_file(path, "pool.jsonl", max_bytes=10)
    assert info.value.message == "pool.jsonl is larger than 10 bytes" and "under 10 bytes" in info.value.fix


def test_read_items_names_the_field_for_a_missing_file(tmp_path: Path) -> None:
    items, problems, _ = read_items(tmp_path / "none.jsonl", "none.jsonl", "items.pool")
    assert not items and [(problem.field, problem.message) for problem in problems] == [("items.pool", "none.jsonl does not exist")]
