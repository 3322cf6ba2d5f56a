"""The probe: checks of a job.toml (job), of a whole workspace with its environment module run in the sandbox
(workspace), and the sandboxed reward source the local trainer and the probe share (reward_source)."""
