"""The trainer-agent policy of the `local` backend: a compact job language and a small torch policy over it.

`job_language` defines the vocabulary, the grammar, the conditioning context and job.toml rendering;
`local_policy` the torch policy that samples jobs and scores them for the outer update.
Both import only torch, pydantic and the schemas (no network, no SDKs).
"""
