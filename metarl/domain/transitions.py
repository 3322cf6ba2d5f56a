"""Pure state transitions of an episode."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.states import Stage

ACTIVE_STAGES = (Stage.agent, Stage.probe, Stage.train, Stage.eval)
TERMINAL_STAGES = (Stage.done, Stage.failed)


@dataclass(frozen=True)
class Transition:
    """Where an episode goes after a stage finishes."""

    stage: Stage
    probe_attempt: int
    ends_unvalidated: bool = False


def after_agent(probe_attempt: int) -> Transition:
    """A submission always goes to the probe."""
    return Transition(Stage.probe, probe_attempt)


def after_probe(passed: bool, probe_attempt: int, max_probe_attempts: int) -> Transition:
    """Pass -> train; fail -> back to the agent with feedback, or end unvalidated at the cap."""
    if passed:
        return Transition(Stage.train, probe_attempt)
    if probe_attempt < max_probe_attempts:
        return Transition(Stage.agent, probe_attempt + 1)
    return Transition(Stage.done, probe_attempt, ends_unvalidated=True)


def after_train(probe_attempt: int) -> Transition:
    return Transition(Stage.eval, probe_attempt)


def after_eval(probe_attempt: int) -> Transition:
    return Transition(Stage.done, probe_attempt)


def is_active(stage: Stage) -> bool:
    return stage in ACTIVE_STAGES
