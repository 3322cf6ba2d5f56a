"""Run prime-rl's own launcher at the pinned tag, in dry-run mode, on metarl's compiled bundles.

    git -C <prime-rl git dir> worktree add /tmp/prime-rl-v0.8.0 v0.8.0
    python scripts/check_bundles_with_primerl.py --checkout /tmp/prime-rl-v0.8.0 [--keep /tmp/metarl-bundles]

For each job of ``metarl.backends.runpod.primerl.variants.checked_jobs`` (every task's default job, plus LoRA, KL
and 4-GPU variants) it compiles the bundle as the Runpod train backend does, writes its
``rl.toml`` into a folder of its own and runs, in the Python 3.12 environment of
``scripts/primerl_tag_env.py`` with the checkout's unmodified ``src/`` on ``PYTHONPATH``::

    python -m prime_rl.entrypoints.rl @ rl.toml --dry-run      # the `rl` console script of the tag

The launcher parses the file with the tag's ``RLConfig`` (every model validator runs) and writes
the resolved ``outputs/configs/{trainer,orchestrator,inference}.toml``; the check then compares
the keys the pod relies on (checkpoint interval, LoRA adapter saving, kl_tau, the zero-advantage
filter, GPU split) with what the compiler wrote (``variants.expected_resolved``), and validates
the rl.toml against the committed derived schema too. Exit 0 when every bundle passes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from primerl_tag_env import REPO, TagEnvError, ensure_env

from metarl.backends.runpod.pod.pin import PRIME_RL_TAG
from metarl.backends.runpod.primerl.compiler import render_rl_toml
from metarl.backends.runpod.primerl.schema import rl_config_problems
from metarl.backends.runpod.primerl.variants import CheckedJob, checked_jobs, compiled, expected_resolved, resolved_value
from schemas.base import load_toml_model
from schemas.task_spec import TaskSpec

SUCCESS_LINE = "Dry run complete"
SUBCONFIGS = ("trainer", "orchestrator", "inference")


def check_one(checked: CheckedJob, folder: Path, interpreter: Path, checkout: Path) -> tuple[bool, list[str]]:
    """(passed, report lines) of one bundle."""
    rl_config = compiled(checked)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rl.toml").write_text(render_rl_toml(rl_config))
    lines = [
        f"{checked.name} (task {checked.task_id}, {checked.job.model.name}, lora_rank {checked.job.model.lora_rank}, {checked.options.gpus_per_node} GPUs)"
    ]
    schema = rl_config_problems(rl_config)
    lines.append(f"  derived schema: {'valid' if not schema else '; '.join(f'{p.path}: {p.message}' for p in schema)}")
    env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "NO_COLOR": "1"}
    result = subprocess.run(
        [str(interpreter), "-m", "prime_rl.entrypoints.rl", "@", "rl.toml", "--dry-run"], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    output = (result.stdout + result.stderr).strip()
    launched = result.returncode == 0 and SUCCESS_LINE in output
    lines.append(
        f"  rl @ rl.toml --dry-run: exit {result.returncode}" + ("" if launched else "\n" + "\n".join("    " + line for line in output.splitlines()[-15:]))
    )
    mismatches = []
    if launched:
        configs = folder / rl_config["output_dir"] / "configs"
        subconfigs = {name: tomllib.loads((configs / f"{name}.toml").read_text()) for name in SUBCONFIGS if (configs / f"{name}.toml").is_file()}
        for key, value in expected_resolved(rl_config).items():
            got = resolved_value(subconfigs, key)
            if got != value:
                mismatches.append(f"{key} = {got!r}, expected {value!r}")
        shown = ", ".join(
            f"{key.split(':')[1]}={resolved_value(subconfigs, key)!r}" for key in ("trainer:ckpt.interval", "trainer:optim.lr", "trainer:loss.kl_tau")
        )
        lines.append(f"  resolved sub-configs: {'as compiled' if not mismatches else 'MISMATCH: ' + '; '.join(mismatches)} ({shown})")
    return launched and not schema and not mismatches, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="prime-rl checkout at the pinned tag")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/metarl-primerl-v0.8.0-venv"), help="the Python 3.12 environment (made if missing)")
    parser.add_argument("--python", default=None, help="a Python 3.12 interpreter to make it with")
    parser.add_argument("--tasks", type=Path, default=REPO / "tasks_specs", help="folder of task specs")
    parser.add_argument("--gpu-count", type=int, default=2, help="backends.train.gpu_count of the default jobs")
    parser.add_argument("--keep", type=Path, default=None, help="write the bundles' folders here and keep them (default: a temporary folder)")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    try:
        interpreter = ensure_env(args.venv, checkout, args.python)
    except TagEnvError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tasks = [load_toml_model(TaskSpec, path) for path in sorted(args.tasks.glob("*.toml"))]
    jobs = checked_jobs(tasks, args.gpu_count)
    with tempfile.TemporaryDirectory(prefix="metarl-primerl-check-") as scratch:
        root = args.keep or Path(scratch)
        print(f"prime-rl {PRIME_RL_TAG} launcher (checkout {checkout}) on {len(jobs)} compiled bundles under {root}")
        results = []
        for checked in jobs:
            passed, lines = check_one(checked, root / checked.name, interpreter, checkout)
            results.append(passed)
            print("\n".join(lines))
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
