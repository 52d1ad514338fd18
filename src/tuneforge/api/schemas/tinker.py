"""The training API's JSON answers (Tinker's wire: docs/tinker-wire.md): the fields the SDK reads,
each answer free to carry more. Protobuf answers (forward_backward and sample results) are bytes
from `retrieve_future`."""

from __future__ import annotations

from typing import Any, Literal

from tuneforge.api.schemas.base import ApiObject


class ClientConfig(ApiObject):
    pjwt_auth_enabled: bool
    credential_default_source: str
    use_pyqwest_transport: bool
    proto_compress_fwdbwd: bool


class DynamicConfig(ApiObject):
    refresh_interval_sec: int


class Accepted(ApiObject):
    status: str


class Capabilities(ApiObject):
    supported_models: list[dict[str, Any]]


class CreatedSession(ApiObject):
    type: Literal["create_session"]
    session_id: str


class Heartbeat(ApiObject):
    type: Literal["session_heartbeat"]


class Nothing(ApiObject):
    """An answer the SDK does not read (the end of a session)."""


class SessionInfo(ApiObject):
    training_run_ids: list[str]
    sampler_ids: list[str]
    user_metadata: dict[str, str] | None


class SessionList(ApiObject):
    sessions: list[str]


class Submitted(ApiObject):
    """A request taken: its future's id (`retrieve_future`), and the model it acts on."""

    request_id: str
    model_id: str


class ModelInfo(ApiObject):
    type: Literal["get_info"]
    model_id: str
    is_lora: bool
    lora_rank: int
    model_name: str
    optimizer_config: dict[str, Any]
    model_data: dict[str, Any]


class SamplingSession(ApiObject):
    sampling_session_id: str
    type: Literal["create_sampling_session"]


class SamplerInfo(ApiObject):
    sampler_id: str
    base_model: str
    model_path: str | None


class SampleSubmitted(ApiObject):
    request_id: str
    sample_sequence_ids: list[str]


class TrainingRuns(ApiObject):
    training_runs: list[dict[str, Any]]
    cursor: dict[str, int]


class TrainingRun(ApiObject):
    training_run_id: str
    base_model: str
    model_owner: str
    is_lora: bool


class Checkpoints(ApiObject):
    checkpoints: list[dict[str, Any]]


class WeightsInfo(ApiObject):
    base_model: str
    is_lora: bool
    lora_rank: int


class PoolJobAnswer(ApiObject):
    """What an ordinary job's attempt on the shared pool is answered (`services/training_api/job_clients.py`):
    its model, a step's loss, the optimizer's figures, a saved state, or `pending` with a request id."""

    pending: str | None = None


class PoolWork(ApiObject):
    """A co-training worker's next cycle (empty: nothing came in time), or `stop`."""

    ops: list[dict[str, Any]]
