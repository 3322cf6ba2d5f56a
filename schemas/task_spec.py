"""Task spec: one task family as the run sees it (`tasks_specs/<family>.toml`).

The `[public]` table is what the trainer agent is shown; `[hidden_eval]` is never copied into a
workspace. A family defined by files alone adds `[items]` (a JSONL pool of training items, or a
registered generator), `hidden_eval.path` (a JSONL hidden eval) and `[grader]` (a built-in grader
or a registered plugin grader, schemas/graders.py); paths are relative to the spec file (metarl.runconfig.load_task_spec checks
the data files and resolves the paths).
"""

from __future__ import annotations

import unicodedata

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from schemas.base import StrictModel
from schemas.graders import GraderSpec

KNOWN_BASE_MODELS = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B")

IDENTIFIER = r"^[a-z][a-z0-9_\-]{0,63}$"
MAX_PATH_CHARS = 1000

MULTILINE_WHITESPACE = frozenset("\n\t")
"""The only non-printable characters a task description may hold (it is rendered into TASK.md)."""


def refuse_control_characters(value: str, allowed: frozenset[str] = frozenset(), what: str = "the text") -> str:
    """``value`` unchanged, or a ``control_character`` error naming the first control, format or separator character.

    Such characters (ESC of terminal escape sequences, NUL, bidi overrides, line separators) would
    reach the agent's TASK.md and any terminal that shows it; ``str.isprintable`` is the test, as in
    ``schemas.config_error.printable``.
    """
    for position, character in enumerate(value):
        if character not in allowed and not character.isprintable():
            raise PydanticCustomError(
                "control_character",
                "{what} contains U+{code} ({name}) at character {position}: terminal escapes and control characters are refused",
                {"what": what, "code": f"{ord(character):04X}", "name": unicodedata.name(character, "a control character"), "position": position},
            )
    return value


class TaskPublic(StrictModel):
    """What the agent sees of the task (rendered into TASK.md)."""

    title: str = Field(min_length=1, max_length=200, description="One-line title of the task")
    description: str = Field(min_length=1, max_length=8000, description="Public description of what the model must learn")
    example_prompt: str = Field(default="", max_length=2000, description="One example prompt in the task's format")
    example_answer: str = Field(default="", max_length=2000, description="The answer to the example prompt")

    @field_validator("title", "example_prompt", "example_answer")
    @classmethod
    def _one_line_of_text(cls, value: str) -> str:
        return refuse_control_characters(value)

    @field_validator("description")
    @classmethod
    def _lines_of_text(cls, value: str) -> str:
        return refuse_control_characters(value, MULTILINE_WHITESPACE)


class TaskData(StrictModel):
    """The dataset a job for this task must ship (its items come from the family's own generator)."""

    min_dataset_size: int = Field(default=16, ge=1, le=1_000_000, description="Smallest dataset a job may ship")
    max_dataset_size: int = Field(default=20000, ge=1, le=1_000_000, description="Largest dataset a job may ship")
    difficulty_range: tuple[float, float] = Field(
        default=(0.0, 1.0), description="Lowest and highest generator difficulty a job may ask for (job.toml `[dataset] difficulty`), within [0, 1]"
    )

    @field_validator("max_dataset_size")
    @classmethod
    def _not_below_min(cls, value: int, info: ValidationInfo) -> int:
        smallest = info.data.get("min_dataset_size")
        if smallest is not None and value < smallest:
            raise PydanticCustomError(
                "dataset_size_range", "max_dataset_size {max} is below min_dataset_size {min}: no dataset size is allowed", {"max": value, "min": smallest}
            )
        return value

    @field_validator("difficulty_range", mode="before")
    @classmethod
    def _pair_from_list(cls, value: object) -> object:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise PydanticCustomError(
                "difficulty_range", "difficulty_range must be two numbers [low, high], for example [0.0, 0.5]; got {value}", {"value": value}
            )
        return tuple(value)

    @field_validator("difficulty_range")
    @classmethod
    def _ordered_unit_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not 0.0 <= low <= high <= 1.0:
            raise PydanticCustomError(
                "difficulty_range", "difficulty_range [{low}, {high}] must satisfy 0 <= low <= high <= 1, for example [0.0, 0.5]", {"low": low, "high": high}
            )
        return value

    def allows_difficulty(self, difficulty: float) -> bool:
        """True when a job may ask for ``difficulty``."""
        low, high = self.difficulty_range
        return low <= difficulty <= high


class HiddenEval(StrictModel):
    """Definition of the hidden eval (never shown to the agent)."""

    n_items: int = Field(default=200, ge=8, le=100_000, description="Number of hidden-eval items")
    version: int = Field(default=1, ge=1, le=1_000_000, description="Eval version; bump to invalidate cached base scores")
    max_tokens: int = Field(default=32, ge=1, le=32768, description="Generation length at eval time")
    pass_k: int = Field(default=1, ge=1, le=64, description="k of pass@k (1 = greedy)")
    solved_improvement: float = Field(default=0.5, gt=0.0, le=1.0, description="Absolute improvement that counts as `solved` when normalising the job reward")
    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATH_CHARS,
        description="JSONL file of hidden-eval items ({prompt, answer} per line), relative to the spec; none: drawn from the generator's secret partition",
    )


class TaskItems(StrictModel):
    """Where a data-defined family's training items come from: a JSONL pool or a registered generator (exactly one)."""

    pool: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_CHARS, description="JSONL file of training items, relative to the spec")
    generator: str | None = Field(default=None, pattern=IDENTIFIER, description="A registered family whose generator draws the items")

    @model_validator(mode="after")
    def _one_source(self) -> TaskItems:
        if (self.generator is None) == (self.pool is None):
            raise PydanticCustomError("items_source", "give exactly one of pool and generator", {})
        return self


class TaskBudget(StrictModel):
    """Compute limits a job for this task must respect."""

    max_train_seconds: float = Field(
        default=300.0, gt=0, le=7 * 24 * 3600, description="Wall-clock cap for one inner job on the CPU train backends (local; the simulator uses it too)"
    )
    max_gpu_train_seconds: float = Field(
        default=600.0,
        gt=0,
        le=7 * 24 * 3600,
        description=(
            "Training-time cap of one inner job on GPU pods (runpod, prime-rl): the pod runner counts it from the first metrics "
            "row, so image pull, model load and vLLM start are not in it, and stops rl at it (the job keeps its last saved weights)"
        ),
    )
    max_rollout_tokens: int = Field(default=2_000_000, ge=1, le=10**12, description="Cap on steps x batch_size x max_tokens (sampled tokens per job)")
    allowed_models: list[str] = Field(default_factory=lambda: list(KNOWN_BASE_MODELS), min_length=1, max_length=16, description="Base models a job may choose")

    def train_seconds_for(self, on_gpu: bool) -> float:
        """The training-time cap of one inner job: the GPU cap on a train backend that trains on GPUs, else the CPU one."""
        return self.max_gpu_train_seconds if on_gpu else self.max_train_seconds

    def with_train_seconds(self, seconds: float, on_gpu: bool) -> TaskBudget:
        """This budget with the cap of a GPU (or CPU) train backend set to `seconds`."""
        return self.model_copy(update={"max_gpu_train_seconds" if on_gpu else "max_train_seconds": float(seconds)})


class TaskSpec(StrictModel):
    """One task: its family, public description, dataset bounds, hidden eval, budget, held-out flag."""

    id: str = Field(pattern=IDENTIFIER, description="Unique task id (file name without .toml)")
    family: str = Field(
        pattern=IDENTIFIER,
        description="Task family implemented by the learning backends (its generator and grader; checked by metarl.runconfig.load_task_spec)",
    )
    held_out: bool = Field(default=False, description="Held out from outer training (evaluated only)")
    public: TaskPublic
    data: TaskData
    hidden_eval: HiddenEval = Field(default_factory=HiddenEval)
    items: TaskItems | None = Field(default=None, description="Training items of a family defined by files (none: `family` is a registered family)")
    grader: GraderSpec | None = Field(
        default=None, description="Grader (built-in or plugin) and its options (none: the registered family's own, or exact match)"
    )
    budget: TaskBudget = Field(default_factory=TaskBudget)

    def with_train_seconds(self, seconds: float, on_gpu: bool) -> TaskSpec:
        """This task with its training-time cap on a GPU (or CPU) train backend set to `seconds`."""
        return self.model_copy(update={"budget": self.budget.with_train_seconds(seconds, on_gpu)})

    @field_validator("budget")
    @classmethod
    def _printable_model_names(cls, value: TaskBudget) -> TaskBudget:
        for index, name in enumerate(value.allowed_models):
            refuse_control_characters(name, what=f"allowed_models entry {index}")
        return value
