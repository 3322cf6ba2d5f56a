"""Hidden-eval scoring on the inner job's own Runpod pod (`[backends.eval] type = "pod_vllm"`).

The protocol is in ``metarl.backends.runpod.pod.eval_server``: once a job's ``exit.json`` says training ended and the
agent's code stopped on its pod, the Runpod train backend publishes the hidden *prompts*
(:func:`eval_request`), the pod generates with vLLM and uploads completion texts, and the train
stage ends. This backend, in the eval stage, grades those completions with the task's graders
(``metarl.learning.scoring.score_completions``, as every scorer does): the answers never leave the
workers.

Base scores: a pod scores the base model too when no score of (task, model) is cached yet; the
train backend keeps those completions under ``<artifacts>/runpod/baselines/`` (first writer wins)
and :meth:`PodVllmEval.score_base` grades them. It cannot score a base model by itself (there is
no pod in the eval stage): until a job has measured it, the agent's ``baseline_score`` tool
answers "unavailable" and the eval stage fails that episode.

Cost: the pod's eval seconds are pod seconds, billed by the train backend (ledger source
``runpod_eval``); :func:`estimate_eval_seconds` is the dry run's estimate of them.
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metarl.backends.runpod.config import PodVllmEvalBackend
from metarl.backends.runpod.pod.eval_server import EngineSettings, EvalRequest, EvalResult, Target, TargetOutput, items_digest
from metarl.backends.runpod.pods import Store
from metarl.errors import PermanentBackendError, TransientBackendError
from metarl.interfaces import BackendServices, BaseModelIdentity, EpisodeContext, Score
from metarl.learning.data_families import family_for
from metarl.learning.families import Example
from schemas.backend_config import expect_config
from schemas.job import JobSpec
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

if TYPE_CHECKING:
    from metarl.learning.scoring import EvalScore

NAME = "pod_vllm"
BASELINES_DIR = "baselines"
PASS_K_TEMPERATURE = 1.0
"""``metarl.learning.scoring.PASS_K_TEMPERATURE`` (kept equal by a test; importing it here would load torch)."""
PROMPT_TOKENS_ESTIMATE = 64
"""Tokens of one chat-formatted hidden prompt, for estimates (the families' prompts are a few dozen characters)."""


class BaselineCompletions(BaseModel):
    """``runpod/baselines/<task>/<model digest>/v<version>.json``: a pod's completions of the base model on a task's hidden eval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str = Field(min_length=1, max_length=100, description="Task id")
    model_name: str = Field(min_length=1, max_length=200, description="Base model")
    eval_version: int = Field(ge=1, description="Hidden-eval version")
    pass_k: int = Field(ge=1, le=64, description="Completions per item")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="items_digest of the prompts")
    output: TargetOutput = Field(description="The completions")
    job_name: str = Field(min_length=1, max_length=191, description="Job whose pod generated them")


def hidden_items(task: TaskSpec) -> tuple[list[Example], list[str]]:
    """The task's hidden-eval items and their prompts (the text every scorer gives the model)."""
    items = family_for(task).hidden_eval(task.hidden_eval.n_items, task.hidden_eval.version)
    return items, [example.prompt for example in items]


def completion_budget(task: TaskSpec) -> int:
    """Tokens generated per item: ``metarl.learning.scoring.max_completion_tokens`` (longest answer, EOS, slack)."""
    return family_for(task).max_answer_chars + 2


def eval_request(task: TaskSpec, config: PodVllmEvalBackend, *, request_id: str, targets: list[Target], published_at: float) -> EvalRequest:
    """What the pod must generate for ``task``: the hidden prompts (no answers), the budget and sampling of every scorer."""
    _, prompts = hidden_items(task)
    return EvalRequest(
        request_id=request_id,
        targets=targets,
        prompts=prompts,
        digest=items_digest(prompts),
        max_tokens=completion_budget(task),
        pass_k=task.hidden_eval.pass_k,
        temperature=PASS_K_TEMPERATURE,
        seed=config.seed * 1_000_003,  # metarl.learning.scoring.pass_k_seed(seed, 0)
        chat=config.chat,
        engine=EngineSettings(dtype=config.dtype, gpu_memory_utilization=config.gpu_memory_utilization, max_model_len=config.max_model_len, seed=config.seed),
        published_at=published_at,
    )


def grade(task: TaskSpec, output: TargetOutput, digest: str) -> EvalScore:
    """Grade a pod's completions against the task's hidden answers (refused when they answer other prompts)."""
    from metarl.learning.scoring import score_completions

    items, prompts = hidden_items(task)
    if digest != items_digest(prompts):
        raise PermanentBackendError(f"the pod's completions answer other prompts than task {task.id}'s hidden eval (version {task.hidden_eval.version})")
    return score_completions(family_for(task), items, output.completions, pass_k=task.hidden_eval.pass_k)


def as_score(result: EvalScore) -> Score:
    return Score(score=result.mean, ci_low=result.ci_low, ci_high=result.ci_high, n_items=max(1, result.n))


def baseline_path(store: Store, task: TaskSpec, model_name: str) -> str:
    """Where a pod's base-model completions for (task, model, eval version) are kept."""
    model_key = hashlib.sha256(model_name.encode("utf-8")).hexdigest()[:16]
    return store.path(BASELINES_DIR, task.id, model_key, f"v{task.hidden_eval.version}.json")


def keep_baseline(store: Store, task: TaskSpec, model_name: str, output: TargetOutput, digest: str, job_name: str) -> bool:
    """Keep a pod's base-model completions unless some are kept already (same inputs; the first wins). True when written."""
    path = baseline_path(store, task, model_name)
    if store.read(path) is not None:
        return False
    record = BaselineCompletions(
        task_id=task.id,
        model_name=model_name,
        eval_version=task.hidden_eval.version,
        pass_k=task.hidden_eval.pass_k,
        digest=digest,
        output=output,
        job_name=job_name,
    )
    store.write_model(path, record)
    return True


def estimate_eval_seconds(task: TaskSpec, config: PodVllmEvalBackend, *, score_base: bool = True, prompt_tokens: int = PROMPT_TOKENS_ESTIMATE) -> float:
    """Pod seconds the on-pod hidden eval of one job of ``task`` takes (billed at the pod's price): one vLLM start per
    model scored (the trained one, plus the base when it is not cached) and the eval's tokens at ``tokens_per_s``."""
    tokens = task.hidden_eval.n_items * task.hidden_eval.pass_k * (prompt_tokens + completion_budget(task))
    engines = 2 if score_base else 1
    return engines * (config.engine_start_s + tokens / config.tokens_per_s)


class PodVllmEval:
    """Grades the completions the job's pod generated on the hidden eval (see the module docstring)."""

    name = NAME
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> PodVllmEval:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.eval, PodVllmEvalBackend), config.artifacts.root)

    def __init__(self, config: PodVllmEvalBackend, artifacts_root: str):
        self.config = config
        self.store = Store(artifacts_root)

    @staticmethod
    def base_model_identity(config: PodVllmEvalBackend, model_name: str, task: TaskSpec) -> BaseModelIdentity:
        """The hub model as the pods load it (the hub's main revision: neither training nor scoring pins another);
        the dtype and chat formatting change the numbers, the seed pass@k sampling."""
        scorer = f"pod_vllm dtype={config.dtype} seed={config.seed} chat={config.chat}"
        return BaseModelIdentity(build=f"{model_name}@main", scale=1.0, scorer=scorer)

    def score_base(self, task: TaskSpec, model_name: str) -> Score:
        """The base score from the completions a job's pod generated for it."""
        record = self._baseline(task, model_name)
        if record is None:
            raise PermanentBackendError(
                f'no pod has scored base model {model_name} on task {task.id} yet: with backends.eval.type = "pod_vllm" base scores '
                "are measured on the pod of the first job that needs one"
            )
        return as_score(grade(task, record.output, record.digest))

    def score_trained(self, ctx: EpisodeContext, job: JobSpec, checkpoint_uri: str | None, train_state: dict[str, Any]) -> Score:
        """The trained score from the completions the job's own pod generated (the base score when the trained model is the base)."""
        if train_state.get("trained_is_base"):
            return self.score_base(ctx.task, job.model.name)
        uri = train_state.get("eval_result_uri")
        if not uri:
            raise PermanentBackendError('the inner job\'s pod left no eval result (was it trained with backends.eval.type = "pod_vllm"?)')
        try:
            data = self.store.read(self.store_path(uri))
        except OSError as err:
            raise TransientBackendError(f"cannot read the pod's eval result {uri}: {err}") from None
        if data is None:
            raise PermanentBackendError(f"the pod's eval result {uri} is gone")
        try:
            result = EvalResult.model_validate_json(data)
        except ValidationError as err:
            raise PermanentBackendError(f"the pod's eval result {uri} is unreadable: {err.errors(include_url=False)[0]['msg']}") from None
        output = result.outputs.get("trained")
        if output is None:
            raise PermanentBackendError(f"the pod's eval result {uri} has no completions of the trained model: {result.error or 'none generated'}")
        return as_score(grade(ctx.task, output, result.digest))

    def store_path(self, uri: str) -> str:
        """A URI the train backend recorded, as a path of this store."""
        return uri if self.store.local else self.store.fs._strip_protocol(uri)

    def _baseline(self, task: TaskSpec, model_name: str) -> BaselineCompletions | None:
        return self.store.read_model(baseline_path(self.store, task, model_name), BaselineCompletions)


def result_uri(store: Store, attempt_dir: str) -> str:
    """The URI of an attempt's eval result (recorded in the job's state for the eval stage)."""
    from metarl.backends.runpod.pod.eval_server import RESULT_FILE

    return store.uri(posixpath.join(attempt_dir, *RESULT_FILE.split("/")))
