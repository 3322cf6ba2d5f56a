"""The hidden eval on the inner job's own pod: the request/result protocol and the pod's side of it.

Order of events (the train backend is ``metarl.backends.runpod.train``, the eval backend
``metarl.backends.runpod.eval``, both on the workers; the pod runs ``metarl.backends.runpod.pod.runner``):

1. The runner stops ``rl`` and every process of its session (the agent's reward code runs in
   rl's env servers), uploads the weights (a LoRA adapter merged first) and writes ``exit.json``.
2. Only then does the train backend, polling, publish ``eval/request.json`` in the job's result
   folder (:class:`EvalRequest`): the hidden prompts (never the answers) and how to generate.
3. The runner, waiting for it (:class:`EvalServer`), copies it to a private local file, runs
   ``scoring.py`` with the pod image's Python once per model to score (the trained weights,
   and the base model when its score is not cached yet), deletes the local copy and
   ``eval/request.json``, and uploads ``eval/result.json`` (:class:`EvalResult`: completion texts).
4. The train backend sees the result, releases the pod (warm pool or settlement) and ends the
   train stage; the eval stage grades the completions with the task's graders.

The agent's code ran on this pod as the same user, so before generating the runner checks that the
scoring stack (prime-rl's venv and source, with vLLM) is what the image was built with
(:func:`verify_manifest` against the root-owned manifest :func:`write_manifest` made at build: no
recorded file changed, no new importable file outside the jobs' own packages), runs the scoring
with every cache (bytecode, compile, Hugging Face, home) in a fresh private folder
(:func:`private_environment`), and downloads the base model afresh there (``base_source =
"download"``) rather than reading the cache the training run filled.

Pydantic and the stdlib only: the pod runner imports this module. ``python -m metarl.backends.runpod.pod.eval_server
--write-manifest OUT ROOT...`` writes the manifest (the image build runs it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if TYPE_CHECKING:
    from metarl.backends.runpod.pod.storage import Storage

EVAL_DIR = "eval"
REQUEST_FILE = f"{EVAL_DIR}/request.json"
RESULT_FILE = f"{EVAL_DIR}/result.json"
SCORING_SCRIPT = Path(__file__).with_name("scoring.py")
STDERR_TAIL_CHARS = 1500
STARTUP_HOOKS = ("sitecustomize.py", "usercustomize.py")
"""Files Python runs at start-up wherever they sit on the path (with ``*.pth`` files in site-packages)."""
IMPORTABLE_SUFFIXES = (".py", ".pyc", ".pth", ".so", ".pyd")
JOB_PACKAGE = re.compile(r"^metarl_env_[0-9a-f]{12}($|-)")
"""A job's environment package and its dist-info, installed into prime-rl's venv for each job (metarl.backends.runpod.primerl.compiler.env_names)."""

Target = Literal["trained", "base"]


def items_digest(prompts: Sequence[str]) -> str:
    """SHA-256 naming a list of eval prompts (a result must name the prompts it answers)."""
    return hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8")).hexdigest()


class EngineSettings(BaseModel):
    """vLLM engine settings of the on-pod eval (from ``[backends.eval]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(default="bfloat16", description="Weight and activation dtype")
    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=0.99, description="GPU memory share of the engine")
    max_model_len: int | None = Field(default=None, ge=16, le=1_048_576, description="Context length (None: longest prompt plus budget)")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Engine seed")


class EvalRequest(BaseModel):
    """``eval/request.json``: what the pod must generate, published only after training ended there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: Literal[1] = Field(default=1, description="Protocol version")
    request_id: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._:\-]+$", description="Job and attempt this request is for")
    targets: list[Target] = Field(min_length=1, max_length=2, description="Models to generate with: the trained weights and/or the base model")
    prompts: list[str] = Field(min_length=1, max_length=100_000, description="Hidden-eval prompts, in item order (no answers)")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="items_digest(prompts)")
    max_tokens: int = Field(ge=1, le=32_768, description="Completion budget per item")
    pass_k: int = Field(ge=1, le=64, description="Completions per item (1: greedy)")
    temperature: float = Field(ge=0.0, le=2.0, description="Sampling temperature of pass@k (unused at pass@1)")
    seed: int = Field(ge=0, le=2**63 - 1, description="Request seed of pass@k sampling")
    chat: bool = Field(default=True, description="Chat-format prompts (thinking off) when the model's tokenizer has a chat template")
    engine: EngineSettings = Field(default_factory=EngineSettings, description="vLLM engine settings")
    published_at: float = Field(ge=0, description="Unix time the worker published it")

    @model_validator(mode="after")
    def _consistent(self) -> EvalRequest:
        if len(set(self.targets)) != len(self.targets):
            raise ValueError("targets must not repeat")
        if items_digest(self.prompts) != self.digest:
            raise ValueError("digest does not match the prompts")
        return self


class TargetOutput(BaseModel):
    """The completions of one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=4096, description="What was loaded: a weights folder on the pod or a cached hub id")
    prompt_format: Literal["chat", "raw"] = Field(description="How prompts were formatted")
    completions: list[list[str]] = Field(max_length=100_000, description="pass_k completion texts per prompt, in prompt order")
    load_s: float = Field(ge=0, description="Engine start seconds")
    generate_s: float = Field(ge=0, description="Generation seconds")


class EvalResult(BaseModel):
    """``eval/result.json``: what the pod generated (or why it could not)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(min_length=1, max_length=255, description="The request answered")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="items_digest of the request's prompts")
    outputs: dict[Target, TargetOutput] = Field(default_factory=dict, description="Completions per target")
    error: str | None = Field(default=None, max_length=2000, description="Why scoring failed (no outputs then)")
    started_at: float = Field(ge=0, description="Unix time the pod read the request")
    finished_at: float = Field(ge=0, description="Unix time the result was written")
    request_deleted: bool = Field(description="The pod deleted eval/request.json before writing this")


class EvalSettings(BaseModel):
    """How a pod runs the eval (part of the runner config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python_command: list[str] = Field(min_length=1, max_length=8, description="The pod image's Python (vLLM, torch, transformers)")
    engine: Literal["vllm", "torch"] = Field(default="vllm", description="Generation engine of scoring.py (torch: CPU, tests)")
    wait_s: float = Field(default=3600.0, gt=0, le=86_400, description="Longest wait for the request after exit.json")
    timeout_s: float = Field(default=3600.0, gt=0, le=86_400, description="Cap on one model's scoring subprocess")
    poll_s: float = Field(default=2.0, gt=0, le=60, description="Seconds between looks for the request")
    model_aliases: dict[str, str] = Field(default_factory=dict, max_length=16, description="Base model name -> what to load instead (tests)")
    stack_manifest: str | None = Field(default=None, max_length=1000, description="Build-time manifest of the scoring stack to verify first (None: no check)")
    base_source: Literal["download", "cache"] = Field(
        default="download", description="Base model: downloaded afresh after the agent's code stopped, or read from the pod's cache"
    )


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_files(root: Path) -> list[Path]:
    """Every file and symlink under ``root`` except bytecode caches (symlinked folders are not followed;
    the scoring runs with its own bytecode cache, so no ``__pycache__`` file is ever read)."""
    out = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name != "__pycache__"]
        out += [Path(folder) / name for name in names]
    return sorted(out)


def new_file_problem(path: Path, root: Path) -> str | None:
    """Why a file that was not in the image matters: it can be imported or run at start-up (outside the jobs' packages)."""
    relative = path.relative_to(root).parts
    if any(JOB_PACKAGE.match(part) for part in relative):
        return None
    if path.suffix in IMPORTABLE_SUFFIXES or ".so." in path.name or path.name in STARTUP_HOOKS:
        return f"{path}: new importable file"
    return None


def private_environment(environment: Mapping[str, str], scratch: Path, fresh_hub_cache: bool) -> dict[str, str]:
    """The scoring's environment: home, bytecode, compile and kernel caches (and the Hugging Face cache, when the
    base model is downloaded afresh) in ``scratch``, so nothing the agent's code left in a cache is loaded."""
    home = scratch / "home"
    env = dict(environment)
    env.update(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        PYTHONPYCACHEPREFIX=str(scratch / "pycache"),
        VLLM_CACHE_ROOT=str(home / ".cache" / "vllm"),
        TRITON_CACHE_DIR=str(home / ".triton"),
        TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"),
    )
    if fresh_hub_cache:
        env["HF_HOME"] = str(home / "huggingface")
        env.pop("HF_HUB_CACHE", None)
        env.pop("HF_HUB_OFFLINE", None)
    return env


def write_manifest(roots: Sequence[Path], out: Path) -> int:
    """Record every file under ``roots`` (sha256, or the link target of a symlink); returns how many."""
    files: dict[str, str] = {}
    for root in roots:
        for path in tree_files(root):
            files[str(path)] = f"link:{os.readlink(path)}" if path.is_symlink() else file_digest(path)
    out.write_text(json.dumps({"roots": [str(root) for root in roots], "files": files}), encoding="utf-8")
    return len(files)


def verify_manifest(manifest: Path) -> list[str]:
    """What differs from the manifest: a recorded file changed, replaced or gone, or a new file that can be imported or
    run at start-up outside the jobs' own packages (the jobs' packages are installed there; their code never runs in the scoring)."""
    recorded = json.loads(manifest.read_text(encoding="utf-8"))
    files: dict[str, str] = recorded["files"]
    problems = []
    for name, expected in files.items():
        path = Path(name)
        if expected.startswith("link:"):
            if not path.is_symlink() or f"link:{os.readlink(path)}" != expected:
                problems.append(f"{name}: link changed")
        elif path.is_symlink() or not path.is_file():
            problems.append(f"{name}: replaced or removed")
        elif file_digest(path) != expected:
            problems.append(f"{name}: content changed")
    for root in recorded["roots"]:
        for path in tree_files(Path(root)):
            if str(path) not in files:
                problem = new_file_problem(path, Path(root))
                if problem is not None:
                    problems.append(problem)
    return problems


# ---------------------------------------------------------------------------------------------
# The pod's side
# ---------------------------------------------------------------------------------------------


class EvalServer:
    """Waits for one eval request of a finished job, generates, uploads the result, deletes the items."""

    def __init__(
        self,
        results: Storage,
        settings: EvalSettings,
        scratch: Path,
        environment: Mapping[str, str],
        still_assigned: Callable[[], bool] = lambda: True,
        on_state: Callable[[str, str], None] = lambda state, message: None,
    ):
        self.results = results
        self.settings = settings
        self.scratch = scratch
        self.environment = dict(environment)
        self.still_assigned = still_assigned
        self.on_state = on_state

    def wait_for_request(self) -> EvalRequest | None:
        """The published request, or None after ``wait_s`` or once the pod is no longer this job's."""
        deadline = time.monotonic() + self.settings.wait_s
        self.on_state("awaiting_eval", "waiting for the eval request")
        while time.monotonic() < deadline and self.still_assigned():
            try:
                return EvalRequest.model_validate_json(self.results.read_bytes(REQUEST_FILE))
            except FileNotFoundError:
                pass
            except (ValidationError, OSError) as err:  # a partial or unreadable write: look again
                log(f"eval request unreadable, retrying: {err}")
            time.sleep(self.settings.poll_s)
        return None

    def serve(self, trained_dir: Path | None, base_model: str) -> EvalResult | None:
        """Answer the job's request (None when none came); ``trained_dir`` None means the trained model is the base."""
        request = self.wait_for_request()
        if request is None:
            log("no eval request came; leaving")
            return None
        started = time.time()
        self.on_state("evaluating", f"scoring {', '.join(request.targets)} on {len(request.prompts)} hidden items")
        self.scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        request_path = self.scratch / "request.json"
        outputs: dict[Target, TargetOutput] = {}
        error = None
        try:
            self.verify_stack()
            fd = os.open(request_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(request.model_dump_json())
            for target in request.targets:
                model = self.model_for(target, trained_dir, base_model)
                outputs[target] = self.generate(request_path, model, target)
        except EvalFailed as err:
            error, outputs = str(err), {}
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        deleted = self.delete_request()
        result = EvalResult(
            request_id=request.request_id,
            digest=request.digest,
            outputs=outputs,
            error=error,
            started_at=started,
            finished_at=time.time(),
            request_deleted=deleted,
        )
        self.results.write_bytes(RESULT_FILE, (result.model_dump_json() + "\n").encode())
        log(f"eval {request.request_id}: {'failed: ' + error if error else 'completions uploaded'}")
        return result

    def verify_stack(self) -> None:
        """Refuse to score with a scoring stack that differs from the image's (the agent's code could write to it)."""
        if self.settings.stack_manifest is None:
            return
        try:
            problems = verify_manifest(Path(self.settings.stack_manifest))
        except (OSError, ValueError, KeyError) as err:
            raise EvalFailed(f"cannot check the scoring stack against {self.settings.stack_manifest}: {err}") from None
        if problems:
            raise EvalFailed(f"the pod's scoring stack differs from the image ({len(problems)} files), e.g. {'; '.join(problems[:3])}")

    def model_for(self, target: str, trained_dir: Path | None, base_model: str) -> str:
        if target == "trained" and trained_dir is not None:
            return str(trained_dir)
        return self.settings.model_aliases.get(base_model, base_model)

    def generate(self, request_path: Path, model: str, target: str) -> TargetOutput:
        out = self.scratch / f"{target}.json"
        command = [
            *self.settings.python_command,
            str(SCORING_SCRIPT),
            "--request",
            str(request_path),
            "--model",
            model,
            "--out",
            str(out),
            "--engine",
            self.settings.engine,
        ]
        download = self.settings.base_source == "download" and not Path(model).is_dir()
        if download:
            command += ["--download-to", str(self.scratch / "base-model")]
        environment = private_environment(self.environment, self.scratch, fresh_hub_cache=download)
        try:
            done = subprocess.run(command, env=environment, capture_output=True, timeout=self.settings.timeout_s, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise EvalFailed(f"scoring {target} ran past {self.settings.timeout_s:g} s") from None
        except OSError as err:
            raise EvalFailed(f"scoring {target} could not start: {err}") from None
        if done.returncode != 0 or not out.is_file():
            tail = done.stderr.decode("utf-8", errors="replace")[-STDERR_TAIL_CHARS:].strip()
            raise EvalFailed(f"scoring {target} exited {done.returncode}: {tail}")
        try:
            return TargetOutput.model_validate_json(out.read_bytes())
        except ValidationError as err:
            raise EvalFailed(f"scoring {target} wrote an unreadable result: {err.errors(include_url=False)[0]['msg']}") from None

    def delete_request(self) -> bool:
        """Remove eval/request.json from storage (the hidden prompts leave the pod's reach)."""
        try:
            self.results.fs.rm(self.results.path(REQUEST_FILE))
        except FileNotFoundError:
            return True
        except OSError as err:
            log(f"could not delete {REQUEST_FILE}: {err}")
            return False
        return True


class EvalFailed(Exception):
    """Scoring on the pod failed; the result says why."""


def log(message: str) -> None:
    print(f"[metarl-eval] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """``--write-manifest OUT ROOT...``: record the scoring stack at image build time."""
    parser = argparse.ArgumentParser(prog="python -m metarl.backends.runpod.pod.eval_server", description=main.__doc__)
    parser.add_argument("--write-manifest", required=True, metavar="OUT", help="manifest file to write")
    parser.add_argument("roots", nargs="+", help="folders to record")
    args = parser.parse_args(argv)
    count = write_manifest([Path(root) for root in args.roots], Path(args.write_manifest))
    print(f"{count} files recorded in {args.write_manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
