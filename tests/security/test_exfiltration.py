"""A hostile tenant tries to make the platform send its secrets to a listener of the tenant's.

The control plane runs with secrets planted in its environment and settings (admin key,
database password, cloud credentials). The tenant — with nothing but its API key — tries
every field that takes a URL or a name: judge and guard endpoints, api_key_env, another
tenant's secret, an operator endpoint that does not exist, webhooks. Those the platform must
refuse answer 400 naming the field; one real job then trains and evaluates against the
listener (allow-listed on 127.0.0.1, as an operator would allow an internal judge) with the
tenant's own secret, and a webhook reports its outcome there. Nothing planted ever reaches
the listener, and the tenant's own key reaches it only as the judge's Bearer token.
"""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for
from tests.helpers.net import send_json
from tuneforge.demo.dataset import chat_example, demo_facts

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only]

PLANTED = "planted-e5b09d3f"
TENANT_KEY = "sk-tenant-judge-31c8"
PLANTED_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "OPENAI_API_KEY", "HF_TOKEN", "DATABASE_URL",
               "TUNEFORGE_SECRETS_KEY_BACKUP", "GITHUB_TOKEN")


class Listener:
    """Records every request (line, headers, body) and answers like a chat endpoint or a
    webhook receiver."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.authorizations: list[str] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> bytes:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                listener.seen.append(f"{self.requestline}\n{self.headers}\n{body.decode(errors='replace')}")
                if self.headers.get("Authorization"):
                    listener.authorizations.append(self.headers["Authorization"])
                return body

            def do_GET(self) -> None:
                self._record()
                self._answer({"ok": True})

            def do_POST(self) -> None:
                body = self._record()
                if self.path.endswith("/chat/completions"):
                    model = json.loads(body).get("model", "m")
                    verdict = "COMPLIANCE" if model == "guard" else "A"
                    self._answer({"id": "c", "object": "chat.completion", "created": 0, "model": model,
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": verdict}}]})
                else:
                    self._answer({"received": True})

            def _answer(self, payload: dict) -> None:
                send_json(self, payload)

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def attack(tmp_path, database_url, tiny_model_dir, monkeypatch):
    for name in PLANTED_ENV:
        monkeypatch.setenv(name, f"{PLANTED}-{name}")
    listener = Listener()
    plane = start_plane(tmp_path, database_url, tiny_model_dir, egress_allow="127.0.0.1",
                        admin_api_key=f"{PLANTED}-admin", eval_by_default=False,
                        secrets_key=None,
                        eval_endpoints={"house-judge": {"url": f"{listener.url}/v1", "model": "judge",
                                                        "api_key": f"{PLANTED}-operator-judge-key"}})
    yield plane, listener
    plane.close()
    listener.close()


def _post(plane, key: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{plane.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _job_body(training: str, task: str, eval_changes: dict) -> dict:
    return {"model": "tiny-chat", "training_file": training, "seed": 0,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {
                "n_epochs": 1, "batch_size": 8, "learning_rate": 1e-3}}},
            "eval": {"task_file": task, "golden": False, "safety": True, "max_new_tokens": 4, "max_examples": 4,
                     "gates": [], **eval_changes}}


def test_no_field_a_tenant_controls_sends_a_planted_secret_anywhere(attack):
    plane, listener = attack
    sdk = plane.sdk(plane.key_a)
    rows = [chat_example(fact) for fact in demo_facts(12, seed=5)]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    training = sdk.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune").id
    task = sdk.files.create(file=("task.jsonl", io.BytesIO(data)), purpose="evals").id
    assert _post(plane, plane.key_a, "/v1/secrets", {"name": "JUDGE_KEY", "value": TENANT_KEY}).status_code == 201
    assert _post(plane, plane.key_b, "/v1/secrets", {"name": "B_KEY", "value": f"{PLANTED}-b"}).status_code == 201
    judge = {"type": "llm_judge", "endpoint": f"{listener.url}/v1", "model": "judge"}
    guard = {"type": "guard_model", "endpoint": f"{listener.url}/v1", "model": "guard"}

    refused = {
        "eval.metrics[0].api_key_env": {"metrics": [{**judge, "api_key_env": "TUNEFORGE_ADMIN_API_KEY"}]},
        "eval.safety_detector.api_key_env": {"safety_detector": {**guard, "api_key_env": "AWS_SECRET_ACCESS_KEY"}},
        "eval.metrics[0].api_key_secret": {"metrics": [{**judge, "api_key_secret": "B_KEY"}]},  # another tenant's
        "eval.safety_detector.endpoint_name": {"safety_detector": {"type": "guard_model", "endpoint_name": "nope"}},
        "eval.metrics[0].endpoint": {"metrics": [{**judge, "endpoint": "http://169.254.169.254/latest/meta-data"}]},
    }
    for param, changes in refused.items():
        answer = _post(plane, plane.key_a, "/v1/fine_tuning/jobs", _job_body(training, task, changes))
        assert answer.status_code == 400, (param, answer.text)
        assert answer.json()["error"]["param"] == param, answer.text
        assert PLANTED not in answer.text
    # 127.0.0.1 is allow-listed here; its neighbour 127.0.0.2 is not, in any spelling
    for url in ("http://169.254.169.254/", "http://2130706434/", "http://0x7f000002/", "http://[::ffff:127.0.0.2]/", "http://10.0.0.1/"):
        answer = _post(plane, plane.key_a, "/v1/webhooks", {"url": url})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "url", (url, answer.text)
    # a model grader's judge: the tenant's own endpoint and secret, or a judge the platform offers
    prompt = [{"role": "user", "content": "{{sample.output_text}}"}]
    grader = {"type": "score_model", "name": "g", "model": "judge", "input": prompt}
    for param, changes in {"grader.endpoint": {"endpoint": "http://169.254.169.254/latest/meta-data"},
                           "grader.api_key_secret": {"endpoint": f"{listener.url}/v1", "api_key_secret": "B_KEY"},
                           "grader.model": {"model": "TUNEFORGE_ADMIN_API_KEY"}}.items():
        answer = _post(plane, plane.key_a, "/v1/fine_tuning/alpha/graders/validate", {"grader": {**grader, **changes}})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, (param, answer.text)
        assert PLANTED not in answer.text
    for changes in ({"endpoint": f"{listener.url}/v1", "api_key_secret": "JUDGE_KEY"}, {"model": "house-judge"}):
        answer = _post(plane, plane.key_a, "/v1/fine_tuning/alpha/graders/run",
                       {"grader": {**grader, **changes}, "model_sample": "x"})
        assert answer.status_code == 200 and PLANTED not in answer.text, answer.text
    hook = _post(plane, plane.key_a, "/v1/webhooks", {"url": f"{listener.url}/hook"})
    assert hook.status_code == 200, hook.text

    created = _post(plane, plane.key_a, "/v1/fine_tuning/jobs", _job_body(training, task, {
        "metrics": ["exact_match", {**judge, "api_key_secret": "JUDGE_KEY"}],
        "safety_detector": {**guard, "api_key_secret": "JUDGE_KEY"}}))
    assert created.status_code == 200, created.text
    by_name = _post(plane, plane.key_a, "/v1/fine_tuning/jobs", _job_body(training, task, {
        "metrics": [{"type": "llm_judge", "endpoint_name": "house-judge"}], "safety": False}))
    assert by_name.status_code == 200, by_name.text
    job_id, named_id = created.json()["id"], by_name.json()["id"]
    done = wait_for(sdk, job_id)
    assert done.status == "succeeded", done.error
    named = wait_for(sdk, named_id)
    assert named.status == "succeeded", named.error
    assert not named.model_extra["eval_results"]["errors"], named.model_extra["eval_results"]["errors"]
    assert not done.model_extra["eval_results"]["errors"], done.model_extra["eval_results"]["errors"]
    assert done.model_extra["eval_results"]["fine_tuned"]["task.llm_judge_win_rate"] is not None

    chat_requests = [entry for entry in listener.seen if "/chat/completions" in entry.split("\n", 1)[0]]
    assert chat_requests, "the judge and the guard were asked"
    # the tenant's key went to the tenant's endpoint as its Bearer token; the operator endpoint got its own
    assert f"Bearer {TENANT_KEY}" in listener.authorizations
    assert set(listener.authorizations) <= {f"Bearer {TENANT_KEY}", f"Bearer {PLANTED}-operator-judge-key"}
    # webhooks arrive too (their outcome events)
    _wait_until(lambda: any("/hook" in entry.split("\n", 1)[0] for entry in listener.seen))
    for entry in listener.seen:
        stripped = entry.replace(f"Bearer {PLANTED}-operator-judge-key", "")
        assert PLANTED not in stripped, entry[:300]
    # nothing the tenant can read holds a planted value or another tenant's secret
    for path in (f"/v1/fine_tuning/jobs/{job_id}", f"/v1/fine_tuning/jobs/{job_id}/events?limit=100",
                 f"/v1/fine_tuning/jobs/{named_id}", "/v1/secrets", "/v1/webhooks"):
        text = httpx.get(f"{plane.url}{path}", headers={"Authorization": f"Bearer {plane.key_a}"}).text
        assert PLANTED not in text and TENANT_KEY not in text and "house-judge\": {" not in text, path


def _wait_until(condition, timeout_s: float = 30.0) -> None:  # noqa: ANN001
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")
