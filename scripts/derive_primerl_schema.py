"""Derive the JSON schema of prime-rl's ``rl.toml`` from its own config classes at the pinned tag.

    git -C <prime-rl git dir> worktree add /tmp/prime-rl-v0.8.0 v0.8.0      # a checkout at the tag, outside the repo
    python scripts/derive_primerl_schema.py --checkout /tmp/prime-rl-v0.8.0  # writes metarl/backends/runpod/primerl/rl_config_v0.8.0.schema.json
    python scripts/derive_primerl_schema.py --checkout /tmp/prime-rl-v0.8.0 --check   # exit 1 if the committed file differs

It builds (once) a Python 3.12 environment with the tag's ``packages/prime-rl-configs`` and its
dependencies (see ``scripts/primerl_tag_env.py``), imports ``prime_rl.configs.rl.RLConfig`` there
and writes ``RLConfig.model_json_schema()`` with an ``x-metarl-provenance`` block naming the tag,
the commit and the package versions. CI validates every compiled config against that file
(``metarl/backends/runpod/primerl/schema.py``); re-run this script when the pin moves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from primerl_tag_env import REPO, SUBMODULE_RELEASES, TagEnvError, ensure_env, installed_versions, run

from metarl.backends.runpod.pod.pin import PRIME_RL_COMMIT, PRIME_RL_TAG
from metarl.backends.runpod.primerl.schema import SCHEMA_FILE

DUMP = (
    "import json, sys\n"
    "from prime_rl.configs.rl import RLConfig\n"
    "schema = RLConfig.model_json_schema(mode='validation')\n"
    "json.dump({'schema': schema, 'python': sys.version.split()[0]}, sys.stdout)\n"
)


def derive(checkout: Path, venv: Path, python: str | None) -> str:
    """The schema file's text (deterministic: sorted keys, one-space indent)."""
    interpreter = ensure_env(venv, checkout, python)
    dumped = json.loads(run([str(interpreter), "-c", DUMP]).stdout)
    provenance = {
        "what": f"prime_rl.configs.rl.RLConfig.model_json_schema(mode='validation') of prime-rl {PRIME_RL_TAG}",
        "prime_rl_tag": PRIME_RL_TAG,
        "prime_rl_commit": PRIME_RL_COMMIT,
        "python": dumped["python"],
        "packages": installed_versions(interpreter),
        "submodule_releases": {name: why for name, (_, why) in SUBMODULE_RELEASES.items()},
        "other_versions": "every other package at the version of the tag's uv.lock",
        "generated_by": "scripts/derive_primerl_schema.py (do not edit by hand)",
    }
    return json.dumps({"x-metarl-provenance": provenance, **dumped["schema"]}, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="prime-rl checkout at the pinned tag")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/metarl-primerl-v0.8.0-venv"), help="where the Python 3.12 environment lives")
    parser.add_argument("--python", default=None, help="a Python 3.12 interpreter (default: python3.12 on PATH, then pyenv's)")
    parser.add_argument("--output", type=Path, default=SCHEMA_FILE, help="schema file to write")
    parser.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    args = parser.parse_args(argv)
    try:
        text = derive(args.checkout.resolve(), args.venv, args.python)
    except TagEnvError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        same = args.output.is_file() and args.output.read_text() == text
        print(
            f"{args.output.relative_to(REPO) if args.output.is_relative_to(REPO) else args.output}: {'up to date' if same else 'DIFFERS from the derived schema'}"
        )
        return 0 if same else 1
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
