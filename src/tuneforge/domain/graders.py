"""OpenAI's grader objects, in their JSON shape (reinforcement fine-tuning and `/v1/fine_tuning/alpha/graders`).

A grader scores one model sample against one dataset item. Its text fields
are templates: `{{item.<field>...}}` reads the item, `{{sample.output_text}}`,
`{{sample.output_json.<field>...}}` and `{{sample.output_tools}}` the sample
(`graders/templates.py`). The types:

- `string_check`: 1 or 0 from `eq`, `ne`, `like` (contains) or `ilike`
  (contains, ignoring case) between `input` and `reference`.
- `text_similarity`: a similarity of `input` to `reference` in [0, 1].
- `score_model` / `label_model`: a judge model scores the sample (a number in
  `range`) or labels it (1 when the label is one of `passing_labels`); the
  judge is `model` (an operator endpoint, a base or `ft:` model served here),
  or the tenant's own `endpoint` (an extension, with `api_key_secret`).
- `python`: `grade(sample, item) -> float`, run in a sandbox.
- `multi`: named sub-graders combined by the formula `calculate_output`.

Every field is bounded here, before anything scores it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

StringOperation = Literal["eq", "ne", "like", "ilike"]
STRING_OPERATIONS: tuple[str, ...] = get_args(StringOperation)

SimilarityMetric = Literal["cosine", "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3",
                           "rouge_4", "rouge_5", "rouge_l"]
SIMILARITY_METRICS: tuple[str, ...] = get_args(SimilarityMetric)

GraderType = Literal["string_check", "text_similarity", "score_model", "label_model", "python", "multi"]
GRADER_TYPES: tuple[str, ...] = get_args(GraderType)

Role = Literal["user", "assistant", "system", "developer"]

MAX_TEMPLATE_CHARS = 65_536  # one text field of a grader
MAX_SOURCE_BYTES = 256 * 1024  # a python grader's source
MAX_MESSAGES = 64  # a model grader's input messages
MAX_SUB_GRADERS = 16  # a multi grader's graders
MAX_LABELS = 64
_NAME = Field(min_length=1, max_length=256, description="The grader's name (it keys its score in sub_rewards).")
_TEMPLATE = Field(max_length=MAX_TEMPLATE_CHARS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class StringCheckGrader(_Strict):
    type: Literal["string_check"]
    name: str = _NAME
    input: str = Field(max_length=MAX_TEMPLATE_CHARS, description="The text checked (a template).")
    reference: str = Field(max_length=MAX_TEMPLATE_CHARS, description="What it is checked against (a template).")
    operation: StringOperation = Field(description="eq, ne, like (contains) or ilike (contains, any case).")


class TextSimilarityGrader(_Strict):
    type: Literal["text_similarity"]
    name: str = _NAME
    input: str = Field(max_length=MAX_TEMPLATE_CHARS, description="The text graded (a template).")
    reference: str = Field(max_length=MAX_TEMPLATE_CHARS, description="The text it is compared with (a template).")
    evaluation_metric: SimilarityMetric
    pass_threshold: float | None = Field(None, description="Evals' pass mark; the reward is the score itself.")


class PythonGrader(_Strict):
    type: Literal["python"]
    name: str = _NAME
    source: str = Field(description="Python source defining grade(sample, item) -> float (at most 256 kB).")
    image_tag: str | None = Field(None, max_length=128, description="Accepted for OpenAI's shape; one image here.")
    pass_threshold: float | None = None

    @field_validator("source")
    @classmethod
    def _bounded(cls, source: str) -> str:
        if len(source.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
            raise ValueError(f"the source is over {MAX_SOURCE_BYTES} bytes")
        return source


class InputText(_Strict):
    type: Literal["input_text", "output_text"]
    text: str = _TEMPLATE


class ModelInput(_Strict):
    """One message of a model grader's prompt; its text may hold templates."""

    role: Role
    content: str | Annotated[list[InputText], Field(max_length=MAX_MESSAGES)] = _TEMPLATE
    type: Literal["message"] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingParams(_Strict):
    max_completions_tokens: int | None = Field(None, ge=1, le=8192)
    reasoning_effort: str | None = Field(None, max_length=16)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)


class _Judged(_Strict):
    """What model graders share: the judge, and where it is asked."""

    name: str = _NAME
    model: str = Field(min_length=1, max_length=256, description=(
        "The judge: an endpoint the operator offers (by name), a base model this platform serves or one of your "
        "ft: models; with `endpoint`, the model name your endpoint is asked for."))
    input: list[ModelInput] = Field(min_length=1, max_length=MAX_MESSAGES)
    sampling_params: SamplingParams | None = None
    endpoint: str | None = Field(None, max_length=2048, description=(
        "Extension: your own OpenAI-compatible API's base URL (https://.../v1), asked instead of this platform's "
        "judges; it passes the platform's egress policy."))
    api_key_secret: str | None = Field(None, min_length=1, max_length=64, description=(
        "Extension: with `endpoint`, the name of one of your secrets (POST /v1/secrets) sent as its bearer key."))

    @field_validator("endpoint")
    @classmethod
    def _url(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ValueError("endpoint must be the http(s) base URL of an OpenAI-compatible API, e.g. "
                             "https://judge.example.com/v1")
        return endpoint

    @model_validator(mode="after")
    def _secret_with_endpoint(self) -> _Judged:
        if self.api_key_secret is not None and self.endpoint is None:
            raise ValueError("api_key_secret is the key of your own endpoint: give `endpoint` too")
        return self


class ScoreModelGrader(_Judged):
    type: Literal["score_model"]
    range: list[float] = Field([0.0, 1.0], min_length=2, max_length=2, description="The score's [low, high].")
    pass_threshold: float | None = None

    @field_validator("range")
    @classmethod
    def _ordered(cls, bounds: list[float]) -> list[float]:
        if not bounds[0] < bounds[1]:
            raise ValueError("range must be [low, high] with low < high")
        return bounds


class LabelModelGrader(_Judged):
    type: Literal["label_model"]
    labels: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(min_length=1, max_length=MAX_LABELS)
    passing_labels: list[Annotated[str, Field(max_length=256)]] = Field(min_length=1, max_length=MAX_LABELS)

    @model_validator(mode="after")
    def _passing_are_labels(self) -> LabelModelGrader:
        unknown = [label for label in self.passing_labels if label not in self.labels]
        if unknown:
            raise ValueError(f"passing_labels {unknown} are not among labels")
        return self


SubGrader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader,
                      Field(discriminator="type")]


class MultiGrader(_Strict):
    type: Literal["multi"]
    name: str = _NAME
    graders: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], SubGrader] = Field(
        min_length=1, max_length=MAX_SUB_GRADERS,
        description="The sub-graders by the names the formula uses (one grader object: keyed by its name).")
    calculate_output: str = Field(min_length=1, max_length=4096, description="A formula of the sub-graders' names: "
                                  "+ - * / ^, min, max, abs, floor, ceil, exp, sqrt, log.")

    @model_validator(mode="before")
    @classmethod
    def _one_grader(cls, raw: Any) -> Any:
        """OpenAI's typed SDK declares `graders` as one grader object: it is keyed by its own name."""
        if isinstance(raw, dict) and isinstance(raw.get("graders"), dict) and "type" in raw["graders"] \
                and isinstance(raw["graders"]["type"], str):
            single = raw["graders"]
            raw = {**raw, "graders": {str(single.get("name", "")): single}}
        return raw


Grader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader
                   | MultiGrader, Field(discriminator="type")]


def sub_graders(grader: Any) -> dict[str, Any]:
    """The graders whose scores a result reports by name: a multi grader's, else the grader itself."""
    if isinstance(grader, MultiGrader):
        return dict(grader.graders)
    return {grader.name: grader}


def has_type(grader: Any, kind: str) -> bool:
    return any(sub.type == kind for sub in sub_graders(grader).values())


def judges(grader: Any) -> dict[str, Any]:
    """The model graders among a grader's sub-graders, by name."""
    return {name: sub for name, sub in sub_graders(grader).items() if sub.type in ("score_model", "label_model")}
