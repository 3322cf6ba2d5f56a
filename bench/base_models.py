"""One set of base models for the learning benchmarks, on every machine: build them once, ship them, install them.

    python -m bench.base_models build --out bench/results/base-models-benchmark-partition   # build, then copy them there
    python -m bench.base_models install --from bench/results/base-models-benchmark-partition  # into the model cache
    python -m bench.base_models show                                                          # the cache's builds, with weight digests

A base model is pretrained from a fixed seed, but its validation accuracy swings widely between checks
and the build keeps the checkpoint nearest a band (`metarl/learning/models.py`, `pretrain`), so the
last bit of a CPU's floating point decides which checkpoint is kept: two machines with the same code
and the same `METARL_EVAL_SECRET` build models with the same build key and other weights (kept steps
340 and 550 for local-s on two AMD EPYC VMs, BENCHMARKS.md). Benchmarks split over sessions and machines
therefore install the shipped builds instead of building their own. `install` copies a shipped folder
only when its build key is the one this checkout and secret ask for (another key would never be
used), and replaces a cached build of that key with other weights only with `--replace`, keeping the
replaced folder beside it. The builds' families are those of the task specs in `--specs`
(default `tasks_specs/`). `bench.versus_search` records each base model's weight digest in its meta
and refuses to merge parts built on other weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._provenance import git_commit, machine
from metarl.learning.eval_secret import EvalSecretMissing, add_artifacts_argument, install_tool_eval_secret, installed_fingerprint
from schemas.base import ConfigError, FieldProblem

REPO = Path(__file__).resolve().parent.parent
WEIGHTS_FILE = "model.safetensors"
BUILD_INFO_FILE = "metarl_build.json"
PROVENANCE_FILE = "provenance.json"


def weights_digest(model_dir: Path) -> str:
    """The first 16 hex digits of the sha256 of a built model's weights file."""
    digest = hashlib.sha256()
    with open(model_dir / WEIGHTS_FILE, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def build_record(model_dir: Path) -> dict[str, Any]:
    """What identifies a built base model: its build key (folder name), weight digest and kept pretraining step."""
    try:
        info = json.loads((model_dir / BUILD_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            str(model_dir), [FieldProblem(field=BUILD_INFO_FILE, message=f"unreadable: {err}", fix="rebuild it (`bench.base_models build`)")]
        ) from None
    return {"build": model_dir.name, "weights": weights_digest(model_dir), "kept_step": info.get("pretrain", {}).get("kept_step")}


def spec_family_sets(specs_dir: Path) -> list[dict[str, Any]]:
    """The family set a base model is pretrained on for each task spec in ``specs_dir`` (ConfigError when there is none)."""
    from metarl.learning.data_families import model_families
    from metarl.runconfig import load_task_spec

    spec_paths = sorted(specs_dir.glob("*.toml"))
    if not spec_paths:
        raise ConfigError(str(specs_dir), [FieldProblem(field="--specs", message="no task spec (*.toml) in it", fix="give the folder of the task specs")])
    return [model_families(load_task_spec(path)) for path in spec_paths]


def expected_builds(specs_dir: Path, scale: float = 1.0) -> dict[str, str]:
    """The build folder names this checkout and secret use for the task specs in ``specs_dir``, each mapped to its model name."""
    from metarl.learning.models import BASE_MODELS, base_model_build

    return {base_model_build(model, scale, families): model for families in spec_family_sets(specs_dir) for model in BASE_MODELS}


def cached_builds(cache_dir: Path, specs_dir: Path) -> dict[str, Path]:
    """Build each base model the task specs need (or find it in ``cache_dir``); its folder by build name."""
    from metarl.learning.models import BASE_MODELS, ensure_base_model

    folders = [ensure_base_model(model, cache_dir, families=families) for families in spec_family_sets(specs_dir) for model in BASE_MODELS]
    return {folder.name: folder for folder in folders}


def copy_build(source: Path, target: Path) -> None:
    """Copy a build folder to ``target`` through a temporary sibling, files readable by all."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for file in sorted(source.iterdir()):
            if file.is_file():
                shutil.copyfile(file, staging / file.name)
                (staging / file.name).chmod(0o644)
        staging.chmod(0o755)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def install_problems(shipped: dict[str, dict[str, Any]], expected: dict[str, str], cached: dict[str, dict[str, Any]], replace: bool) -> list[FieldProblem]:
    """Why shipped builds cannot be installed: a build key this checkout and secret never use, or a cached build of the same
    key with other weights (without ``replace``)."""
    problems = []
    for name, record in sorted(shipped.items()):
        if name not in expected:
            problems.append(
                FieldProblem(
                    field=name,
                    message=f"this checkout and hidden-eval secret build {sorted(expected)} instead, so this build would never be used",
                    fix="export the METARL_EVAL_SECRET the builds were made under (their provenance.json names its fingerprint) at the commit they name, "
                    "or build your own with `python -m bench.base_models build`",
                )
            )
        elif name in cached and cached[name]["weights"] != record["weights"] and not replace:
            problems.append(
                FieldProblem(
                    field=name,
                    message=f"the cache holds this build with other weights ({cached[name]['weights']}, kept step {cached[name]['kept_step']})",
                    fix="add --replace to put the shipped weights in its place (the cached folder is kept beside it)",
                )
            )
    return problems


def build_main(args: argparse.Namespace) -> int:
    """Build the base models for the task specs and copy them, with a provenance file, to ``--out``."""
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for name, folder in sorted(cached_builds(args.cache_dir, args.specs).items()):
        if (args.out / name).exists():
            shutil.rmtree(args.out / name)
        copy_build(folder, args.out / name)
        records.append(build_record(args.out / name))
        print(json.dumps(records[-1]), flush=True)
    provenance = {"commit": git_commit(), "machine": machine(), "eval_partition": installed_fingerprint(), "builds": records}
    (args.out / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    print(f"# {len(records)} builds and {PROVENANCE_FILE} in {args.out}")
    return 0


def install_main(args: argparse.Namespace) -> int:
    """Copy the shipped builds in ``--from`` into the model cache (see the module docstring)."""
    cache_dir = args.cache_dir or default_cache()
    if not args.source.is_dir():
        print(f"error: --from {args.source}: no such folder; give the folder `build` wrote (BENCHMARKS.md names the shipped one)", file=sys.stderr)
        return 2
    shipped = {
        folder.name: build_record(folder)
        for folder in sorted(args.source.iterdir())
        if (folder / BUILD_INFO_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()
    }
    if not shipped:
        print(f"error: no build folder (one holding {BUILD_INFO_FILE}) in {args.source}", file=sys.stderr)
        return 2
    cached = {name: build_record(cache_dir / name) for name in shipped if (cache_dir / name / WEIGHTS_FILE).is_file()}
    problems = install_problems(shipped, expected_builds(args.specs), cached, args.replace)
    if problems:
        print(f"error: {ConfigError(str(args.source), problems)}", file=sys.stderr)
        return 2
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name, record in shipped.items():
        if name in cached and cached[name]["weights"] == record["weights"]:
            print(f"{name}: already installed ({record['weights']})")
            continue
        if name in cached:
            kept = cache_dir / f"{name}.replaced-{cached[name]['weights']}"
            (cache_dir / name).rename(kept)
            print(f"{name}: the cached weights {cached[name]['weights']} moved to {kept}")
        copy_build(args.source / name, cache_dir / name)
        print(f"{name}: installed ({record['weights']}, kept step {record['kept_step']})")
    return 0


def show_main(args: argparse.Namespace) -> int:
    """Print the record of each cached build the task specs use (``-`` for one not built)."""
    cache_dir = args.cache_dir or default_cache()
    for name in sorted(expected_builds(args.specs)):
        folder = cache_dir / name
        print(json.dumps(build_record(folder)) if (folder / BUILD_INFO_FILE).is_file() else f"{name}: -")
    return 0


def default_cache() -> Path:
    """The model cache the run and the benches use (``$METARL_CACHE_DIR`` or ``~/.cache/metarl/models``)."""
    from metarl.learning.models import default_cache_dir

    return default_cache_dir()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.base_models", description=__doc__.split("\n\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the base models for the task specs and copy them to --out")
    build.add_argument("--out", type=Path, required=True, help="folder for the build folders and provenance.json")
    install = commands.add_parser("install", help="copy shipped builds into the model cache")
    install.add_argument("--from", dest="source", type=Path, required=True, help="folder written by `build`")
    install.add_argument("--replace", action="store_true", help="replace a cached build of the same key with other weights (kept beside it)")
    show = commands.add_parser("show", help="the cache's builds for the task specs, with weight digests")
    for sub in (build, install, show):
        sub.add_argument("--specs", type=Path, default=REPO / "tasks_specs", help="folder of task specs whose families the builds cover (default tasks_specs/)")
        sub.add_argument("--cache-dir", type=Path, default=None, help="model cache (default $METARL_CACHE_DIR or ~/.cache/metarl/models)")
        add_artifacts_argument(sub)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        install_tool_eval_secret(args.artifacts)
        return {"build": build_main, "install": install_main, "show": show_main}[args.command](args)
    except (ConfigError, EvalSecretMissing) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
