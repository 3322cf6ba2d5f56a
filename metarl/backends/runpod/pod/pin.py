"""The one prime-rl release inner jobs target (stdlib only: the pod runner imports it).

Why v0.8.0: it is the last release whose trainer still writes Hugging Face weights under
``<output_dir>/weights/step_N/`` (vLLM loads them directly for the hidden eval); later main writes
only DCP trainer checkpoints. Config key names change between releases and prime-rl rejects
unknown keys, so the compiler and :mod:`metarl.backends.runpod.primerl.schema` (whose JSON schema is derived from
the tag's own classes) target exactly this tag.
"""

from __future__ import annotations

PRIME_RL_TAG = "v0.8.0"
"""Git tag of the pinned prime-rl release."""

PRIME_RL_VERSION = "0.8.0"
"""``[project] version`` of prime-rl's pyproject.toml at the tag (checked inside the image)."""

PRIME_RL_COMMIT = "60bc29547a8824ad1de7b9af8d265e2b27b2a72d"
"""Commit the tag points to (2026-08-06)."""

VERIFIERS_COMMIT = "d30a3f48e5f14b06b3081b2102ec32cc3149b849"
"""The ``deps/verifiers`` submodule commit at the tag: the verifiers API the environment package targets."""

PRIME_RL_IMAGE = "ghcr.io/primeintellect-ai/prime-rl:v0.8.0"
"""Image that prime-rl's release workflow builds for the tag (``build_image.yaml``: registry/name:tag)."""

PRIME_RL_IMAGE_CUDA = "12.8"
"""CUDA version the image needs on the host: the tag's ``Dockerfile.cuda`` builds its runtime stage on
``nvidia/cuda:12.8.1-base-ubuntu24.04`` (CUDA 12.8 toolkit, torch from the ``pytorch-cu128`` index),
and that base image's ``NVIDIA_REQUIRE_CUDA`` (cuda>=12.8) keeps the container from starting on a host
whose driver offers less. Pods are created only on hosts with this version or a newer one."""

PRIME_RL_VENV_PYTHON = "/app/.venv/bin/python"
"""Interpreter of prime-rl's virtual environment in that image (``UV_PROJECT_ENVIRONMENT=/app/.venv``)."""
