"""Shipped base models for the benchmarks (`bench.base_models`): what install refuses, what it copies and what it keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.base_models import REPO, build_record, expected_builds, install_problems, main
from metarl.learning import eval_secret


def make_build(folder: Path, weights: bytes, kept_step: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "metarl_build.json").write_text(json.dumps({"pretrain": {"kept_step": kept_step}}), encoding="utf-8")
    return folder


@pytest.fixture()
def benchmark_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The benchmark's partition key installed for this test; the arguments a command needs for its artifacts root."""
    monkeypatch.setattr(eval_secret, "_installed", [])
    monkeypatch.setenv("METARL_EVAL_SECRET", "metarl-benchmark-partition-v1")
    return ["--artifacts", str(tmp_path / "artifacts")]


def test_a_build_record_names_the_folder_the_weights_and_the_kept_step(tmp_path: Path) -> None:
    first = build_record(make_build(tmp_path / "local-s-k1", b"weights one", 340))
    second = build_record(make_build(tmp_path / "other" / "local-s-k1", b"weights two", 340))
    assert first["build"] == "local-s-k1" and first["kept_step"] == 340
    assert len(first["weights"]) == 16 and first["weights"] != second["weights"]


def test_install_refuses_a_key_never_used_and_other_cached_weights_unless_replaced() -> None:
    shipped = {"local-s-k1": {"weights": "aaaa", "kept_step": 1}, "local-l-old": {"weights": "cccc", "kept_step": 2}}
    cached = {"local-s-k1": {"weights": "bbbb", "kept_step": 3}}
    problems = install_problems(shipped, {"local-s-k1": "local-s", "local-l-k2": "local-l"}, cached, replace=False)
    assert [problem.field for problem in problems] == ["local-l-old", "local-s-k1"]
    assert "METARL_EVAL_SECRET" in problems[0].fix and "local-l-k2" in problems[0].message
    assert "--replace" in problems[1].fix and "bbbb" in problems[1].message
    assert [problem.field for problem in install_problems(shipped, {"local-s-k1": "local-s", "local-l-old": "local-l"}, cached, replace=True)] == []


def test_install_copies_the_shipped_build_and_keeps_the_one_it_replaces(tmp_path: Path, benchmark_key: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    name = next(build for build, model in expected_builds(REPO / "tasks_specs").items() if model == "local-s")
    shipped = tmp_path / "shipped"
    make_build(shipped / name, b"shipped weights", 550)
    cache = tmp_path / "cache"
    old = build_record(make_build(cache / name, b"weights built here", 340))
    arguments = ["install", "--from", str(shipped), "--cache-dir", str(cache), *benchmark_key]
    assert main(arguments) == 2
    assert "--replace" in capsys.readouterr().err and (cache / name / "model.safetensors").read_bytes() == b"weights built here"
    assert main([*arguments, "--replace"]) == 0
    assert (cache / name / "model.safetensors").read_bytes() == b"shipped weights"
    assert (cache / f"{name}.replaced-{old['weights']}" / "model.safetensors").read_bytes() == b"weights built here"
    assert main(arguments) == 0 and "already installed" in capsys.readouterr().out


def test_install_refuses_builds_of_another_secret(tmp_path: Path, benchmark_key: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    make_build(tmp_path / "shipped" / "local-s-0000000000000000", b"w", 1)
    assert main(["install", "--from", str(tmp_path / "shipped"), "--cache-dir", str(tmp_path / "cache"), *benchmark_key]) == 2
    assert "local-s-0000000000000000" in capsys.readouterr().err and not (tmp_path / "cache" / "local-s-0000000000000000").exists()
    assert main(["install", "--from", str(tmp_path / "nowhere"), "--cache-dir", str(tmp_path / "cache"), *benchmark_key]) == 2
    assert "--from" in capsys.readouterr().err
