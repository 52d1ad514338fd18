"""The `tinker-cookbook`'s basic recipes, unchanged, against a live control plane on 127.0.0.1.

`sl_basic` (supervised) and `rl_basic` (reinforcement) are each run through their own `main`
on the tiny base and on data that never leaves this machine. The recipes' defaults name a
hosted model and HF hub datasets, so the configs are built the way their
`build_config_blueprint` builds them, with only these supported swaps:

* the tokenizer: `tokenizer_utils.register_tokenizer(base, factory)` makes the cookbook's
  `get_tokenizer(base)` load the base's local folder instead of asking the hub;
* the renderer: `role_colon`, the cookbook's model-agnostic chat format, named explicitly
  (its model table, `model_info`, knows hosted names only);
* the data: the cookbook's own `FromConversationFileBuilder` over the conversations file it
  ships (`example_data/conversations.jsonl`) for supervised learning, and its synthetic
  arithmetic environment (`ArithmeticDatasetBuilder`) for RL.

Every connection the test process tries to a host other than loopback is refused and
recorded: the only one the recipes make is the cookbook's best-effort download of its
pricing table, which it tolerates.

Skipped where `tinker-cookbook` is not installed; the RL test also needs its `math-rl` extra
(`rl_basic` imports the GSM8K environment's grader).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import math
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

tinker = pytest.importorskip("tinker")
cookbook = pytest.importorskip("tinker_cookbook")
import chz  # noqa: E402
from tinker_cookbook import tokenizer_utils  # noqa: E402
from tinker_cookbook.renderers import TrainOnWhat  # noqa: E402
from tinker_cookbook.utils.cost_estimation import PRICING_URL  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only]

BASE = "tiny-chat"
RENDERER = "role_colon"
RUN_LIMIT_S = 180  # one recipe run on the tiny base takes well under a minute
CONVERSATIONS = Path(cookbook.__file__).parent / "example_data" / "conversations.jsonl"
# the one outside name the recipes look up: the host of the cookbook's pricing table
PRICING_LOOKUP = f"lookup {urlparse(PRICING_URL).hostname}"


class OutsideConnections:
    """Refuses, and records, every name lookup and connection of this process that is not for
    a loopback address: the recipes must run with no network but 127.0.0.1."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    @staticmethod
    def _loopback(host: Any) -> bool:
        if host in (None, "", "localhost"):
            return True
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_getaddrinfo = socket.getaddrinfo
        real_connect = socket.socket.connect
        real_connect_ex = socket.socket.connect_ex

        def getaddrinfo(host, *args, **kwargs):
            if not self._loopback(host.decode() if isinstance(host, bytes) else host):
                self.refused.append(f"lookup {host}")
                raise socket.gaierror(socket.EAI_NONAME, f"{host}: only loopback is reachable here")
            return real_getaddrinfo(host, *args, **kwargs)

        def allowed(sock: socket.socket, address: Any) -> bool:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return True
            return self._loopback(address[0])

        def connect(sock, address):
            if not allowed(sock, address):
                self.refused.append(f"connect {address}")
                raise ConnectionRefusedError(f"{address}: only loopback is reachable here")
            return real_connect(sock, address)

        def connect_ex(sock, address):
            if not allowed(sock, address):
                self.refused.append(f"connect {address}")
                return errno.ECONNREFUSED
            return real_connect_ex(sock, address)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


@pytest.fixture
def offline_cookbook(running, monkeypatch):
    """The environment of a recipe run: the SDK pointed at the live plane with tenant A's key,
    hub lookups off, the base's tokenizer registered under its served name, and nothing but
    loopback reachable. Yields the record of refused outside connections."""
    monkeypatch.setenv("TINKER_BASE_URL", f"{running.url}/tinker")
    monkeypatch.setenv("TINKER_API_KEY", f"tml-{running.key_a}")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(running.model_dir))
    tokenizer_utils.register_tokenizer(BASE, lambda: tokenizer)
    outside = OutsideConnections()
    outside.install(monkeypatch)
    yield outside
    tokenizer_utils.unregister_tokenizer(BASE)


def run_bounded(main: Callable[[Any], None], config: Any) -> None:
    """A recipe's `main(config)` in a thread, failing the test if it outlives RUN_LIMIT_S."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            main(config)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            failure.append(error)

    worker = threading.Thread(target=target, name="cookbook-recipe", daemon=True)
    worker.start()
    worker.join(RUN_LIMIT_S)
    if worker.is_alive():
        pytest.fail(f"the recipe did not finish within {RUN_LIMIT_S} s")
    if failure:
        raise failure[0]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rest_client(running) -> Any:
    """A REST client of this plane. Named explicitly: the SDK keeps one session-less client per
    process for the same arguments, so one built from the environment alone would still talk
    to an earlier test's plane."""
    return tinker.RestClient(base_url=f"{running.url}/tinker", api_key=f"tml-{running.key_a}")


def run_id_of(tinker_path: str) -> str:
    """The training run of a checkpoint path, tinker://<run>/<kind>/<name>."""
    return tinker_path.removeprefix("tinker://").split("/")[0]


def step_rows(log_path: Path) -> dict[int, dict[str, Any]]:
    """metrics.jsonl by step (several rows of one step are merged)."""
    rows: dict[int, dict[str, Any]] = {}
    for row in read_jsonl(log_path / "metrics.jsonl"):
        if row.get("step") is not None:
            rows.setdefault(row["step"], {}).update(row)
    return rows


def test_sl_basic_trains_on_the_shipped_conversations_saves_resumes_and_lists_its_checkpoints(
        running, offline_cookbook, tmp_path, monkeypatch) -> None:
    from tinker_cookbook.recipes import sl_basic
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    log_path = tmp_path / "sl_basic"
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=BASE, renderer_name=RENDERER,
                                            max_length=256, batch_size=8,
                                            train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)

    def config(max_steps: int) -> train.Config:
        # sl_basic.build_config_blueprint's settings, on the local base and the shipped file
        return chz.Blueprint(train.Config).apply({
            "log_path": str(log_path),
            "model_name": BASE,
            "recipe_name": "recipe_sl_basic",
            "renderer_name": RENDERER,
            "dataset_builder": FromConversationFileBuilder(common_config=common,
                                                           file_path=str(CONVERSATIONS), test_size=16),
            "learning_rate": 1e-2,
            "lr_schedule": "linear",
            "num_epochs": 1,
            "eval_every": 2,
            "save_every": 2,
            "lora_rank": 8,
            "max_steps": max_steps,
        }).make()

    run_bounded(sl_basic.main, config(max_steps=3))

    rows = step_rows(log_path)
    assert sorted(rows) == [0, 1, 2], rows
    nll = [rows[step]["train_mean_nll"] for step in range(3)]
    assert all(math.isfinite(value) and value > 0 for value in nll), nll
    assert all(rows[step]["num_loss_tokens"] > 0 for step in range(3)), rows
    # the held-out conversations, scored through a sampler of the weights before steps 0 and 2:
    # two steps taught the base something of them
    assert rows[2]["test/nll"] < rows[0]["test/nll"] - 1.0, rows

    records = read_jsonl(log_path / "checkpoints.jsonl")
    names = [record["name"] for record in records]
    assert names == ["000002", "final"], records
    run_id = run_id_of(records[-1]["state_path"])
    for record in records:
        assert record["state_path"] == f"tinker://{run_id}/weights/{record['name']}"
        assert record["sampler_path"] == f"tinker://{run_id}/sampler_weights/{record['name']}"

    rest = rest_client(running)
    listed = {c.tinker_path: c for c in rest.list_checkpoints(run_id).result().checkpoints}
    for record in records:
        assert listed[record["state_path"]].checkpoint_type == "training"
        assert listed[record["sampler_path"]].checkpoint_type == "sampler"
    training_run = rest.get_training_run(run_id).result()
    assert training_run.base_model == BASE
    assert (training_run.user_metadata or {}).get("renderer_name") == RENDERER

    # a run stopped after its periodic save at step 2 (the final record never written): the
    # same command again, more steps asked for, is asked what to do with the existing log
    # folder, told "resume", and goes on from that save in a new training run of the state
    # and optimizer saved there, re-running step 2 onward
    (log_path / "checkpoints.jsonl").write_text(json.dumps(records[0]) + "\n")
    prompts: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt="": prompts.append(prompt) or "resume")
    run_bounded(sl_basic.main, config(max_steps=5))
    assert len(prompts) == 1 and "already exists" in prompts[0], prompts
    resumed = step_rows(log_path)
    assert sorted(resumed) == [0, 1, 2, 3, 4], resumed
    assert [resumed[step]["train_mean_nll"] for step in (0, 1)] == nll[:2]  # kept from the first run
    assert all(math.isfinite(resumed[step]["train_mean_nll"]) for step in (2, 3, 4)), resumed
    assert resumed[4]["test/nll"] < rows[0]["test/nll"] - 1.0, resumed
    records = read_jsonl(log_path / "checkpoints.jsonl")
    # the new run saves again at its first step (2), then at 4, then its final state
    assert [record["name"] for record in records] == ["000002", "000002", "000004", "final"], records
    resumed_run = run_id_of(records[-1]["state_path"])
    assert resumed_run != run_id
    assert rest.get_training_run(resumed_run).result().base_model == BASE
    listed = {c.tinker_path for c in rest.list_checkpoints(resumed_run).result().checkpoints}
    assert {path for record in records[1:] for path in (record["state_path"], record["sampler_path"])} == listed

    assert set(offline_cookbook.refused) <= {PRICING_LOOKUP}, offline_cookbook.refused


def test_rl_basic_samples_scores_and_trains_on_the_arithmetic_environment(
        running, offline_cookbook, tmp_path) -> None:
    rl_basic = pytest.importorskip("tinker_cookbook.recipes.rl_basic")  # needs tinker-cookbook[math-rl]
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder
    from tinker_cookbook.rl import train

    log_path = tmp_path / "rl_basic"
    builder = ArithmeticDatasetBuilder(batch_size=2, group_size=4, n_batches=3, renderer_name=RENDERER,
                                       model_name_for_tokenizer=BASE)
    # rl_basic.build_config_blueprint's settings, with the local arithmetic environment for GSM8K
    config = chz.Blueprint(train.Config).apply({
        "model_name": BASE,
        "recipe_name": "recipe_rl_basic",
        "renderer_name": RENDERER,
        "log_path": str(log_path),
        "dataset_builder": builder,
        "learning_rate": 1e-3,
        "max_tokens": 12,
        "eval_every": 0,
        "save_every": 2,
        "lora_rank": 8,
    }).make()

    run_bounded(rl_basic.main, config)

    # one row per training step (and a closing row of token totals)
    rows = {step: row for step, row in step_rows(log_path).items() if "progress/batch" in row}
    assert sorted(rows) == [0, 1, 2], rows
    for step, row in rows.items():
        numbers = [v for v in row.values() if isinstance(v, (int, float))]
        assert all(math.isfinite(v) for v in numbers), (step, row)
        # 2 problems x 4 samples each, every sample at most max_tokens long and logprob'd
        assert row["env/all/total_episodes"] == 8, row
        assert 0 < row["tokens/sampled"] <= 8 * 12, row
        assert -0.1 <= row["env/all/reward/total"] <= 1.0, row
        # the trainer's logprobs of the sampled tokens (forward_backward) match those the sampler
        # reported for the same weights: the two sides agree on what the policy is
        assert row["optim/kl_sample_train_v2"] < 1e-4, row
        assert row["optim/entropy"] > 0, row
        summaries = read_jsonl(log_path / f"iteration_{step:06d}" / "train_rollout_summaries.jsonl")
        assert len(summaries) == 8 and all(1 <= t["steps"][0]["ac_len"] <= 12 for t in summaries), summaries

    records = read_jsonl(log_path / "checkpoints.jsonl")
    assert [record["name"] for record in records] == ["000002", "final"], records
    run_id = run_id_of(records[-1]["state_path"])
    rest = rest_client(running)
    listed = {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints}
    assert {records[-1]["state_path"], records[-1]["sampler_path"]} <= listed

    assert set(offline_cookbook.refused) <= {PRICING_LOOKUP}, offline_cookbook.refused
