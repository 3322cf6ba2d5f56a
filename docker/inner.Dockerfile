# syntax=docker/dockerfile:1
# The inner-job pod image: the pinned prime-rl release plus metarl's pod runner.
#
# The build context is the metarl/ package folder (the runner needs nothing else from the repo):
#   docker build -f docker/inner.Dockerfile -t metarl-inner:prime-rl-v0.8.0 metarl
#
# The base is the image prime-rl's release workflow builds for the tag (build_image.yaml:
# ghcr.io/primeintellect-ai/prime-rl:<tag>); its venv is /app/.venv, its entry script
# /app/docker-entrypoint.sh (ulimit, then exec "$@"), its user appuser. The pin lives in
# metarl/backends/runpod/pod/pin.py; tests/unit/test_primerl_dockerfile.py keeps this file in step with it.
# Pods start with METARL_RUNPOD_ROOT and METARL_POD_NAME (and storage credentials for the runner
# only: rl never sees them); metarl/backends/runpod/pod/supervisor.py follows the pod's assignment file and runs
# each job assigned to it with metarl/backends/runpod/pod/runner.py, so a warm pod takes job after job.
# After training, the runner merges a LoRA adapter (metarl/backends/runpod/pod/lora_merge.py) and, with
# [backends.eval] type = "pod_vllm", serves the job's hidden eval (metarl/backends/runpod/pod/eval_server.py), generating
# with metarl/backends/runpod/pod/scoring.py: both scripts run with prime-rl's own Python (vLLM, torch, safetensors).
# The agent's reward code runs as appuser during training; the base image lets appuser sudo, which
# is removed here, and the runner's code stays root-owned, so that code cannot rewrite the runner
# or the scoring scripts the eval runs later; prime-rl's venv and source (appuser's) are recorded in
# a root-owned manifest that the eval verifies before it scores.
ARG PRIME_RL_IMAGE=ghcr.io/primeintellect-ai/prime-rl:v0.8.0
FROM ${PRIME_RL_IMAGE}

ARG PRIME_RL_TAG=v0.8.0
ARG PRIME_RL_VERSION=0.8.0
ARG PRIME_RL_COMMIT=60bc29547a8824ad1de7b9af8d265e2b27b2a72d
LABEL org.opencontainers.image.title="metarl-inner" \
      org.opencontainers.image.description="prime-rl ${PRIME_RL_TAG} with the metarl pod runner" \
      ai.metarl.prime-rl.tag="${PRIME_RL_TAG}" \
      ai.metarl.prime-rl.commit="${PRIME_RL_COMMIT}"

USER root

# Refuse a base image that is not the pinned release (or lacks what the merge and the eval use).
RUN /app/.venv/bin/python -c "import importlib.metadata as m, sys; v = m.version('prime-rl'); sys.exit(0 if v == '${PRIME_RL_VERSION}' else 'prime-rl ' + v + ' is not the pinned ${PRIME_RL_VERSION}')" \
    && /app/.venv/bin/python -c "import verifiers, datasets, safetensors, transformers" \
    && /app/.venv/bin/python -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 'no vllm in prime-rl venv')"

# No passwordless sudo for appuser (the agent's code runs as appuser).
RUN sed -i '/^appuser ALL=(ALL) NOPASSWD:ALL$/d' /etc/sudoers && (gpasswd -d appuser sudo || true)

# Environment packages are installed with --no-build-isolation (no index needed at job start):
# make sure prime-rl's venv has the setuptools build backend.
RUN /app/.venv/bin/python -c "import setuptools" \
    || uv pip install --python /app/.venv/bin/python "setuptools>=64"

# The runner's own small environment, apart from prime-rl's: pydantic, fsspec, s3fs.
RUN uv venv --python /usr/bin/python3.12 /opt/metarl-runner \
    && uv pip install --python /opt/metarl-runner/bin/python "pydantic==2.14.4" "fsspec==2026.9.0" "s3fs==2026.9.0"

COPY __init__.py /opt/metarl-runner/src/metarl/
COPY backends/__init__.py /opt/metarl-runner/src/metarl/backends/
COPY backends/runpod/__init__.py /opt/metarl-runner/src/metarl/backends/runpod/
COPY backends/runpod/pod/ /opt/metarl-runner/src/metarl/backends/runpod/pod/
RUN rm -rf /opt/metarl-runner/src/metarl/backends/runpod/pod/__pycache__ \
    && echo /opt/metarl-runner/src \
       > "$(/opt/metarl-runner/bin/python -c 'import site; print(site.getsitepackages()[0])')/metarl_runner.pth" \
    && /opt/metarl-runner/bin/python -c "import metarl.backends.runpod.pod.runner as r, metarl.backends.runpod.pod.supervisor as s, metarl.backends.runpod.pod.eval_server as e, metarl.backends.runpod.pod.pin as p; assert p.PRIME_RL_TAG == '${PRIME_RL_TAG}'" \
    && /app/.venv/bin/python /opt/metarl-runner/src/metarl/backends/runpod/pod/scoring.py --help > /dev/null \
    && { /app/.venv/bin/python /opt/metarl-runner/src/metarl/backends/runpod/pod/lora_merge.py 2> /dev/null; test $? -eq 2; } \
    && /opt/metarl-runner/bin/python -m metarl.backends.runpod.pod.eval_server --write-manifest /opt/metarl-runner/scoring-stack.json /app/.venv /app/src \
    && chown -R root:root /opt/metarl-runner && chmod -R go-w /opt/metarl-runner \
    && mkdir -p /tmp/metarl-job && chown -R appuser:appuser /tmp/metarl-job

USER appuser
# Nothing else runs as appuser on a pod: once rl stops, every other appuser process is the agent's.
# /app stays appuser's (prime-rl's layout): the eval checks it against the manifest recorded above.
ENV METARL_RUNNER_WORK_DIR=/tmp/metarl-job METARL_RUNNER_AGENT_SWEEP=uid METARL_RUNNER_EVAL_STACK_MANIFEST=/opt/metarl-runner/scoring-stack.json

ENTRYPOINT ["/app/docker-entrypoint.sh", "/opt/metarl-runner/bin/python", "-m", "metarl.backends.runpod.pod.supervisor"]
CMD []
