"""Hidden-eval scoring with vLLM for GPU eval workers (`[backends.eval] type = "vllm"`).

Each score runs ``python -m metarl.backends.vllm.scoring`` in a subprocess: vLLM starts its own engine
process, which a Celery pool child (a daemon process) may not do, and the GPU memory of one
checkpoint is freed before the next is loaded. Prompts, stop tokens and graders are the local
scorer's (``metarl.learning.scoring``); only the generate step differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from metarl.backends.vllm.config import VLLM_EXTRA_FIX, VllmEvalBackend
from metarl.errors import PermanentBackendError, TransientBackendError
from metarl.interfaces import BackendServices, BaseModelIdentity, EpisodeContext, Score
from metarl.learning.data_families import family_for, model_families
from schemas.backend_config import expect_config
from schemas.base import ConfigError, FieldProblem
from schemas.job import JobSpec
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
STDERR_TAIL_CHARS = 2000


def checkpoint_folder(checkpoint_uri: str) -> Path:
    """The local folder of a checkpoint URI (a path or ``file://`` URL); other schemes are refused."""
    parsed = urlparse(checkpoint_uri)
    if parsed.scheme == "file":
        path = Path(parsed.path)
    elif parsed.scheme == "":
        path = Path(checkpoint_uri)
    else:
        raise PermanentBackendError(f"checkpoint {checkpoint_uri!r}: the vllm evaluator reads local folders only; sync it to the eval host first")
    if not (path / "config.json").is_file():
        raise PermanentBackendError(f"checkpoint {checkpoint_uri!r} is not a Hugging Face weights folder (no config.json)")
    return path


class VllmEval:
    """Hidden-eval scoring with vLLM on a GPU, through the same prompt and grading code as every scorer."""

    name = "vllm"
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> VllmEval:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.eval, VllmEvalBackend))

    def __init__(self, config: VllmEvalBackend):
        from metarl.backends.vllm.scoring import vllm_available

        if not vllm_available():
            raise ConfigError(
                "run config",
                [
                    FieldProblem(
                        field="backends.eval.type",
                        message="`vllm` needs the vllm package, which is not installed on this host",
                        fix=f'{VLLM_EXTRA_FIX}, or use type = "local"',
                    )
                ],
            )
        self.config = config

    @staticmethod
    def base_model_identity(config: VllmEvalBackend, model_name: str, task: TaskSpec) -> BaseModelIdentity:
        """The stand-in's build at the configured scale; the dtype changes the numbers, the seed pass@k sampling."""
        from metarl.learning.models import base_model_build

        scorer = f"vllm dtype={config.dtype} seed={config.seed}"
        build = base_model_build(model_name, config.model_scale, families=model_families(task))
        return BaseModelIdentity(build=build, scale=config.model_scale, scorer=scorer)

    def _score(self, model_dir: Path, task: TaskSpec) -> Score:
        """Score ``model_dir`` on the task's hidden eval in a vLLM subprocess."""
        from metarl.learning.scoring import EvalScore

        env = {key: value for key, value in os.environ.items() if not key.upper().endswith(SECRET_SUFFIXES)}
        with tempfile.TemporaryDirectory(prefix="metarl-vllm-") as scratch:
            out = Path(scratch) / "score.json"
            request = Path(scratch) / "request.json"
            items = family_for(task).hidden_eval(task.hidden_eval.n_items, task.hidden_eval.version)
            request.write_text(json.dumps({"task": task.model_dump(mode="json"), "items": [item.model_dump() for item in items]}), encoding="utf-8")
            command = [
                sys.executable,
                "-m",
                "metarl.backends.vllm.scoring",
                "--model-dir",
                str(model_dir),
                "--request",
                str(request),
                "--pass-k",
                str(task.hidden_eval.pass_k),
                "--config",
                self.config.model_dump_json(),
                "--out",
                str(out),
            ]
            try:
                finished = subprocess.run(command, capture_output=True, text=True, timeout=self.config.timeout_s, env=env, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise TransientBackendError(f"vllm scoring of {model_dir} ran past backends.eval.timeout_s = {self.config.timeout_s}") from None
            if finished.returncode != 0 or not out.is_file():
                tail = (finished.stderr or "")[-STDERR_TAIL_CHARS:].strip()
                raise TransientBackendError(f"vllm scoring of {model_dir} exited with {finished.returncode}: {tail}")
            result = EvalScore.model_validate(json.loads(out.read_text(encoding="utf-8"))["score"])
        return Score(score=result.mean, ci_low=result.ci_low, ci_high=result.ci_high, n_items=max(1, result.n))

    def score_base(self, task: TaskSpec, model_name: str) -> Score:
        """Score the local base model ``model_name`` stands for (built on first use, as the local scorer does)."""
        from metarl.learning.models import ensure_base_model

        base_dir = ensure_base_model(model_name, self.config.model_cache_dir, scale=self.config.model_scale, families=model_families(task))
        return self._score(base_dir, task)

    def score_trained(self, ctx: EpisodeContext, job: JobSpec, checkpoint_uri: str | None, train_state: dict[str, Any]) -> Score:
        """Score the inner job's trained weights (a local Hugging Face folder); a job whose trained model is
        the base (a Runpod job without learning signal that saved nothing: ``trained_is_base``) scores the base."""
        if checkpoint_uri is None and train_state.get("trained_is_base"):
            return self.score_base(ctx.task, job.model.name)
        if checkpoint_uri is None:
            raise PermanentBackendError("the inner job left no checkpoint to score")
        return self._score(checkpoint_folder(checkpoint_uri), ctx.task)
