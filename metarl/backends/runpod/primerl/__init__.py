"""prime-rl inner jobs: the pinned release, its config schema, the job compiler and the probe check.

Importing this package imports nothing else: the pod runner (``metarl.backends.runpod.pod.runner``) uses
``metarl.backends.runpod.pod.pin`` and ``metarl.backends.runpod.pod.manifest`` inside the pod image, where only pydantic
and fsspec are installed.

- ``pin``: the pinned prime-rl release (tag, commits, image).
- ``schema``: the pinned release's ``rl.toml`` JSON schema, derived from its own config classes
  (``rl_config_<tag>.schema.json``, made by ``scripts/derive_primerl_schema.py``), a ``jsonschema``
  validator for it and the release's cross-field rules a compiled job can meet.
- ``compiler``: a job (job.toml + workspace) becomes ``rl.toml`` plus an installable verifiers
  environment package, written as a job bundle.
- ``checks``: :func:`metarl.backends.runpod.primerl.checks.primerl_compile_problems`, the probe's backend check.
- ``variants``: the compiled jobs the checks against prime-rl cover (CI's schema test, the launcher script).
"""
