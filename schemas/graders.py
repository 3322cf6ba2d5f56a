"""The `[grader]` table of a task spec: one of the built-in graders of metarl/graders.py with its options,
or a plugin grader (``kind = "plugin"``) that an installed package registers (metarl/learning/grader_plugins.py).

Each kind is a model with bounded options, discriminated by ``kind``; ``model_dump()`` of a grader
is the plain mapping the graders file takes (the same in metarl, in the sandbox and on the pod).
These models check the shape only: whether a plugin is registered and accepts its options is checked
where plugins are known (metarl.learning.data_families.build_family).
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Annotated, Literal

import re2
from pydantic import Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator
from pydantic_core import PydanticCustomError

from schemas.base import StrictModel

Charset = Literal["any", "digits", "letters", "number"]

MAX_PATTERN_CHARS = 200
MAX_PLUGIN_OPTIONS = 32
MAX_PLUGIN_OPTION_LIST = 64
MAX_PLUGIN_OPTION_CHARS = 200
MAX_PLUGIN_OPTIONS_BYTES = 8192
PLUGIN_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
"""A plugin grader's name (metarl.graders.PLUGIN_NAME: ``metarl_grader_NAME`` is its module)."""


LINEAR_TIME_FIX = (
    "write the pattern in RE2 syntax, without backreferences (\\1), lookaround ((?=, (?!, (?<=, (?<!), possessive "
    "quantifiers (a++), atomic groups or repetition counts over 1000 (graders match in linear time)"
)
_POSIX_CLASS = re.compile(r"\[:\^?[a-z]+:\]")
_OPEN_LOWER_BOUND = re.compile(r"(?<!\\)\{,")
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


def _compiles(pattern: str) -> str:
    """``pattern`` unchanged when both grader engines take it with one meaning (metarl.graders: RE2, and its pure-Python
    Pike VM, which parses with the standard library), else an error naming the problem and the fix."""
    if _POSIX_CLASS.search(pattern) or _OPEN_LOWER_BOUND.search(pattern):
        raise PydanticCustomError(
            "regex_ambiguous",
            "it uses a POSIX class ([[:alpha:]]) or a repetition without a lower bound ({,n}), which the grader engines read differently",
            {"fix": "write the class as ranges ([A-Za-z]) and the repetition as {0,n}"},
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "possible nested set": read literally, as RE2 reads it
            re.compile(pattern)
    except re.error as exc:
        raise PydanticCustomError(
            "regex_syntax", "not a valid regular expression: {reason}", {"reason": str(exc), "fix": "correct the regular expression's syntax"}
        ) from None
    try:
        re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PydanticCustomError(
            "regex_not_linear",
            "RE2 cannot compile it ({reason}): graders run regular expressions in linear time, so a pattern that needs backtracking is refused",
            {"reason": reason, "fix": LINEAR_TIME_FIX},
        ) from None
    return pattern


class _Shaped(StrictModel):
    """Options every string-comparing grader shares: case, and the answer's shape (the format reward)."""

    case_sensitive: bool = Field(default=True, description="Compare case as written (false: case-folded)")
    charset: Charset = Field(default="any", description="Characters a well-formed answer is made of (the format reward)")
    min_chars: int = Field(default=1, ge=1, le=10_000, description="Shortest well-formed answer")
    max_chars: int = Field(default=100, ge=1, le=10_000, description="Longest well-formed answer")
    format_pattern: str | None = Field(default=None, max_length=MAX_PATTERN_CHARS, description="A well-formed answer fully matches this regular expression")

    @field_validator("format_pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        return None if value is None else _compiles(value)

    @model_validator(mode="after")
    def _length_range(self) -> _Shaped:
        if self.max_chars < self.min_chars:
            raise ValueError(f"max_chars {self.max_chars} is below min_chars {self.min_chars}")
        return self


class ExactGrader(_Shaped):
    """1 when the completion equals the answer (surrounding whitespace aside), else 0."""

    kind: Literal["exact"] = Field(description="Grader kind")


class PositionalGrader(_Shaped):
    """Exact match, else partial credit for the share of positions that agree (left-aligned)."""

    kind: Literal["positional"] = Field(description="Grader kind")
    partial_credit: float = Field(default=0.5, ge=0.0, le=1.0, description="Score of a fully similar but inexact answer")


class RightAlignedDigitsGrader(_Shaped):
    """Exact match, else partial credit for the digits that agree counted from the right (numbers)."""

    kind: Literal["right_aligned_digits"] = Field(description="Grader kind")
    partial_credit: float = Field(default=0.5, ge=0.0, le=1.0, description="Score of a fully similar but inexact answer")
    charset: Charset = Field(default="digits", description="Characters a well-formed answer is made of (the format reward)")


class NumericGrader(StrictModel):
    """A number within the tolerance of the answer scores 1; else partial credit falling with the relative error."""

    kind: Literal["numeric"] = Field(description="Grader kind")
    tolerance: float = Field(default=0.0, ge=0.0, le=1e12, description="Absolute tolerance")
    relative_tolerance: float = Field(default=0.0, ge=0.0, le=1.0, description="Tolerance as a share of the answer's magnitude")
    partial_credit: float = Field(default=0.5, ge=0.0, le=1.0, description="Score of an almost right but out-of-tolerance number")
    max_chars: int = Field(default=32, ge=1, le=10_000, description="Longest well-formed answer")


class _ListGrader(StrictModel):
    """Options of graders of separated lists."""

    separator: str = Field(default=",", min_length=1, max_length=8, description="Item separator")
    case_sensitive: bool = Field(default=True, description="Compare items' case as written (false: case-folded)")
    partial_credit: float = Field(default=0.5, ge=0.0, le=1.0, description="Score of a fully similar but inexact answer")
    max_chars: int = Field(default=1000, ge=1, le=10_000, description="Longest well-formed answer")


class UnorderedSetGrader(_ListGrader):
    """The same set of items in any order scores 1; else partial credit by overlap (Jaccard)."""

    kind: Literal["unordered_set"] = Field(description="Grader kind")


class SortedListGrader(_ListGrader):
    """The answer's items in sorted order score 1; else partial credit for the positions that agree."""

    kind: Literal["sorted_list"] = Field(description="Grader kind")


class ChoiceGrader(StrictModel):
    """The answer is one of N choices: 1 for the right one, 0 otherwise; any choice is well formed."""

    kind: Literal["choice"] = Field(description="Grader kind")
    choices: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(min_length=2, max_length=64, description="The allowed answers")
    case_sensitive: bool = Field(default=False, description="Compare case as written (false: case-folded)")


InnerGrader = Annotated[
    ExactGrader | PositionalGrader | RightAlignedDigitsGrader | NumericGrader | UnorderedSetGrader | SortedListGrader | ChoiceGrader,
    Field(discriminator="kind"),
]


class RegexExtractGrader(StrictModel):
    """The answer is extracted from the completion by a regular expression, then graded by ``inner``."""

    kind: Literal["regex_extract"] = Field(description="Grader kind")
    pattern: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS, description="Regular expression searched in the completion")
    group: int = Field(default=0, ge=0, le=9, description="Group of the match that holds the answer (0: the whole match)")
    inner: InnerGrader = Field(description="The grader applied to the extracted text")

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: str) -> str:
        return _compiles(value)

    @model_validator(mode="after")
    def _group_exists(self) -> RegexExtractGrader:
        groups = re.compile(self.pattern).groups
        if self.group > groups:
            raise ValueError(f"group {self.group} but the pattern has {groups} group(s)")
        return self


PluginOptionScalar = StrictBool | StrictInt | Annotated[StrictFloat, Field(allow_inf_nan=False)] | Annotated[str, Field(max_length=MAX_PLUGIN_OPTION_CHARS)]
PluginOptionValue = PluginOptionScalar | Annotated[list[PluginOptionScalar], Field(max_length=MAX_PLUGIN_OPTION_LIST)]
"""A plugin grader option: a JSON scalar (no null) or a short list of them."""


class PluginGrader(StrictModel):
    """Grades with a plugin grader: a standard-library module an installed package registers under the entry-point
    group ``metarl.graders``, called with ``options`` (which its ``check_options`` may refuse)."""

    kind: Literal["plugin"] = Field(description="Grader kind")
    plugin: str = Field(pattern=PLUGIN_NAME_PATTERN, description="The plugin grader's registered name (its entry point's name)")
    options: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")], PluginOptionValue] = Field(
        default_factory=dict, max_length=MAX_PLUGIN_OPTIONS, description="Options passed to the plugin's functions (JSON scalars or short lists)"
    )

    @field_validator("options")
    @classmethod
    def _options_small(cls, value: dict[str, object]) -> dict[str, object]:
        size = len(json.dumps(value))
        if size > MAX_PLUGIN_OPTIONS_BYTES:
            raise ValueError(f"the options take {size} bytes as JSON; keep them under {MAX_PLUGIN_OPTIONS_BYTES}")
        return value


GraderSpec = Annotated[InnerGrader | RegexExtractGrader | PluginGrader, Field(discriminator="kind")]
"""A `[grader]` table."""

GRADER_MODELS: tuple[type[StrictModel], ...] = (
    ExactGrader,
    NumericGrader,
    PositionalGrader,
    RightAlignedDigitsGrader,
    UnorderedSetGrader,
    SortedListGrader,
    ChoiceGrader,
    RegexExtractGrader,
    PluginGrader,
)
