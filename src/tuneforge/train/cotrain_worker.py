"""The co-training worker: `python -m tuneforge.train.cotrain_worker` with its spec (JSON) on stdin.

It loads one base model once and then, cycle after cycle, asks the control plane for work
(`POST /internal/v1/pools/{pool}/work`, with the pool's token), runs it on the `SharedBase`
(train/cotrain.py) and sends the results with its next request:

1. models created or loaded (a checkpoint's state comes inside the op: a worker reads no object
   of any tenant itself),
2. every forward_backward of the cycle in one batched pass through the base,
3. optimizer steps, each model's own,
4. saves (the state goes back to the control plane, which writes it), sampler snapshots, samples.

The spec: {"pool_id", "token", "callback_url", "base_dir", "base_name", "device", "max_pass_tokens"}.
"""

from __future__ import annotations

import base64
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from tuneforge.domain import tinker_wire as wire
from tuneforge.train.cotrain import (
    AdamParams,
    Datum,
    ForwardBackward,
    LoraShape,
    RequestError,
    SampleRequest,
    SharedBase,
)

log = logging.getLogger("tuneforge.cotrain_worker")
RETRY_S = 1.0
GIVE_UP_S = 120.0  # the control plane unreachable this long: the worker exits (its pool is restarted)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _datum(item: wire.Datum, where: str) -> Datum:
    if item.other_chunks:
        raise RequestError(f"{where}.model_input: only encoded_text chunks are served here (no images)")
    inputs: dict[str, torch.Tensor] = {}
    for key, tensor in item.inputs.items():
        if key == "target_tokens":
            inputs[key] = torch.tensor(tensor.values, dtype=torch.long).reshape(tensor.shape)
        else:  # weights, advantages, logprobs...: real numbers whatever dtype the client declared
            inputs[key] = torch.tensor(tensor.values, dtype=torch.float32).reshape(tensor.shape)
    return Datum(list(item.tokens), inputs)


class Worker:
    def __init__(self, base: SharedBase, spec: dict[str, Any]) -> None:
        self.base = base
        self.spec = spec

    def run_cycle(self, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results: dict[str, dict[str, Any]] = {}
        order = {"create": 0, "load": 0, "forward_backward": 1, "optim_step": 2, "save": 3, "snapshot": 3,
                 "release": 4, "drop": 4, "sample": 5}
        fbs: list[tuple[dict[str, Any], ForwardBackward]] = []
        samples: list[dict[str, Any]] = []
        for op in sorted(ops, key=lambda op: order.get(op["kind"], 9)):
            try:
                self._restore(op)
                if op["kind"] == "forward_backward":
                    fbs.append((op, self._forward_backward(op)))
                    continue
                if op["kind"] == "sample":
                    samples.append(op)
                    continue
                if fbs:
                    self._run_fbs(fbs, results)
                    fbs = []
                results[op["op_id"]] = {"ok": True, **self._one(op)}
            except RequestError as exc:
                results[op["op_id"]] = {"ok": False, "error": exc.message, "category": exc.category}
            except Exception as exc:  # noqa: BLE001 - the platform's fault: this op fails, the worker goes on
                log.exception("op %s (%s) failed", op.get("op_id"), op.get("kind"))
                results[op["op_id"]] = {"ok": False, "category": "server",
                                        "error": f"the worker failed on this request ({type(exc).__name__})"}
        if fbs:
            self._run_fbs(fbs, results)
        if samples:
            self._run_samples(samples, results)
        return [{"op_id": op["op_id"], **results[op["op_id"]], "hosted": op.get("model") in self.base.adapters}
                for op in ops if op["op_id"] in results]

    def _restore(self, op: dict[str, Any]) -> None:
        """Load the kept state an op carries for a model this worker does not hold yet."""
        restore = op.pop("restore", None)
        if restore is not None and op.get("model") and op["model"] not in self.base.adapters:
            self.base.load_state(op["model"], base64.b64decode(restore["state"]),
                                 with_optimizer=bool(restore.get("optimizer", True)))

    def states(self) -> dict[str, str]:
        """Every hosted model's state (weights and optimizer), to be kept when this worker stops."""
        return {name: _b64(adapter.state_bytes(with_optimizer=True, with_gradients=True))
                for name, adapter in self.base.adapters.items()}

    def _forward_backward(self, op: dict[str, Any]) -> ForwardBackward:
        if "data" in op:  # an ordinary job's step (services/training_api/job_clients.py): rows as JSON
            rows = [Datum(list(row["tokens"]), {"target_tokens": torch.tensor(row["target_tokens"], dtype=torch.long),
                                                "weights": torch.tensor(row["weights"], dtype=torch.float32)})
                    for row in op["data"]]
            return ForwardBackward(op["model"], rows, str(op["loss_fn"]), {}, bool(op.get("forward_only")))
        try:
            request = wire.decode_forward_backward(base64.b64decode(op["body"]))
        except wire.WireError as exc:
            raise RequestError(f"the forward_backward body is not a valid message: {exc}") from exc
        data = [_datum(item, f"data[{index}]") for index, item in enumerate(request.data)]
        return ForwardBackward(op["model"], data, request.loss_fn, dict(request.loss_fn_config), request.forward_only)

    def _run_fbs(self, fbs: list[tuple[dict[str, Any], ForwardBackward]], results: dict[str, dict[str, Any]]) -> None:
        started = time.perf_counter()
        outcomes = self.base.forward_backward([request for _op, request in fbs])
        elapsed = time.perf_counter() - started
        done = [(request, outcome) for (_op, request), outcome in zip(fbs, outcomes)
                if not isinstance(outcome, RequestError)]
        passed = sum(request.tokens() for request, _outcome in done) or 1
        for (op, _request), outcome in zip(fbs, outcomes):
            if isinstance(outcome, RequestError):
                results[op["op_id"]] = {"ok": False, "error": outcome.message, "category": outcome.category}
                continue
            fields = {
                "logprobs": wire.OutputField([lp.reshape(-1).tolist() for lp in outcome.logprobs],
                                             list(outcome.logprobs[0].shape[1:])),
                "elementwise_loss": wire.OutputField([loss.reshape(-1).tolist() for loss in outcome.elementwise_loss],
                                                     list(outcome.elementwise_loss[0].shape[1:])),
            }
            metrics = {**outcome.metrics, "ntokens:sum": float(sum(len(d.tokens) for d in _request.data))}
            results[op["op_id"]] = {"ok": True, "proto": _b64(wire.encode_forward_backward_output(fields, metrics)),
                                    "metrics": metrics,
                                    "tokens": _request.tokens(),
                                    "seconds": elapsed * _request.tokens() / passed}  # its share of the pass

    def _one(self, op: dict[str, Any]) -> dict[str, Any]:
        kind, name = op["kind"], op["model"]
        if kind == "create":
            shape = LoraShape(**op["shape"])
            self.base.host(name, shape)
            return {"json": {"model_id": name}}
        if kind == "load":
            adapter = self.base.load_state(name, base64.b64decode(op["state"]), with_optimizer=bool(op["optimizer"]))
            return {"json": {"model_id": name, "shape": adapter.shape.to_json()}}
        if kind == "optim_step":
            params = AdamParams(**op["adam"])
            metrics = self.base.optim_step(name, params)
            return {"json": {"metrics": metrics}}
        if kind == "save":
            adapter = self.base.adapters.get(name)
            if adapter is None:
                raise RequestError(f"model {name} is not hosted")
            out: dict[str, Any] = {"state": _b64(adapter.state_bytes(with_optimizer=True))}
            if op.get("peft"):
                import safetensors.torch

                out["peft_weights"] = _b64(safetensors.torch.save(adapter.peft_weights()))
                out["peft_config"] = adapter.peft_config(self.spec.get("base_source") or self.spec["base_name"])
            return out
        if kind == "snapshot":  # a frozen copy of a model's current weights, sampled under another name
            adapter = self.base.adapters.get(name)
            if adapter is None:
                raise RequestError(f"model {name} is not hosted")
            self.base.load_state(op["as"], adapter.state_bytes(with_optimizer=False), with_optimizer=False)
            return {"json": {}}
        if kind == "drop":
            self.base.drop(name)
            return {"json": {}}
        if kind == "release":  # idle: its state goes to the control plane, which keeps it
            adapter = self.base.adapters.get(name)
            if adapter is None:
                raise RequestError(f"model {name} is not hosted")
            state = _b64(adapter.state_bytes(with_optimizer=True, with_gradients=True))
            self.base.drop(name)
            return {"state": state}
        raise RequestError(f"unknown operation {kind}")

    def _run_samples(self, ops: list[dict[str, Any]], results: dict[str, dict[str, Any]]) -> None:
        """Every sample request of the cycle, of whatever models, in one batch (`sample_many`); the
        batch's time shared by the rows' tokens."""
        requests = []
        for op in ops:
            params = op["sampling_params"]
            requests.append(SampleRequest(op["model"], op["prompt"], op["num_samples"], params["max_tokens"],
                                          params["temperature"], params["top_k"], params["top_p"], params["stop"],
                                          params.get("seed"), bool(op["prompt_logprobs"])))
        started = time.perf_counter()
        outcomes = self.base.sample_many(requests)
        elapsed = time.perf_counter() - started
        sizes = [request.num_samples * (len(request.prompt) + request.max_tokens) for request in requests]
        total = sum(size for size, outcome in zip(sizes, outcomes) if not isinstance(outcome, RequestError)) or 1
        for op, request, outcome, size in zip(ops, requests, outcomes, sizes):
            if isinstance(outcome, RequestError):
                results[op["op_id"]] = {"ok": False, "error": outcome.message, "category": outcome.category}
                continue
            sequences = [wire.SampledSequence(s.tokens, s.logprobs, s.stopped) for s in outcome.sequences]
            results[op["op_id"]] = {
                "ok": True, "proto": _b64(wire.encode_sample_response(sequences, outcome.prompt_logprobs)),
                "tokens": sum(len(s.tokens) for s in outcome.sequences), "prefill": len(request.prompt),
                "seconds": elapsed * size / total}


class _Stop(Exception):
    pass


def serve(spec: dict[str, Any], base: SharedBase, stop: threading.Event | None = None) -> str:
    """Cycles until the control plane says stop ("stopped"). On SIGTERM (preemption; or `stop` set
    before, while the base loaded) the cycle under way finishes, then its results and the state of
    every hosted model go back in one last request ("preempted"). "unreachable": the control plane
    did not answer for GIVE_UP_S."""
    worker = Worker(base, spec)
    url = f"{spec['callback_url'].rstrip('/')}/internal/v1/pools/{spec['pool_id']}/work"
    headers = {"Authorization": f"Bearer {spec['token']}"}
    results: list[dict[str, Any]] = []
    failing_since: float | None = None
    stopping = {"asked": False, "polling": False}

    def on_term(_signum: int, _frame: Any) -> None:
        stopping["asked"] = True
        if stopping["polling"]:  # waiting for work: stop waiting (what was sent was received)
            raise _Stop

    signal.signal(signal.SIGTERM, on_term)
    if stop is not None and stop.is_set():
        stopping["asked"] = True
    with httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0)) as client:
        while True:
            if stopping["asked"]:
                _hand_back(client, url, headers, results, worker)
                return "preempted"
            try:
                stopping["polling"] = True
                try:
                    reply = client.post(url, json={"results": results}, headers=headers)
                finally:
                    stopping["polling"] = False
            except _Stop:
                _hand_back(client, url, headers, [], worker)
                return "preempted"
            except httpx.HTTPError as exc:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > GIVE_UP_S:
                    log.error("the control plane is unreachable (%r): exiting", exc)
                    return "unreachable"
                time.sleep(RETRY_S)
                continue
            if reply.status_code in (401, 404, 410):
                log.info("the control plane ended this pool (%s): exiting", reply.status_code)
                return "stopped"
            if reply.status_code != 200:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > GIVE_UP_S:
                    return "unreachable"
                time.sleep(RETRY_S)
                continue
            failing_since = None
            body = reply.json()
            if body.get("stop"):
                return "stopped"
            results = worker.run_cycle(body.get("ops") or [])


def _hand_back(_client: httpx.Client, url: str, headers: dict[str, str], results: list[dict[str, Any]],
               worker: Worker) -> None:
    body = {"results": results, "stopping": True, "states": worker.states()}
    with httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0)) as fresh:  # the other may be mid-request
        for _attempt in range(5):
            try:
                if fresh.post(url, json=body, headers=headers).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(RETRY_S)
    log.error("could not hand back the hosted models' state: they resume from their last checkpoints")


def run_pool_attempt(spec: Any, store: Any, reporter: Any, stop: threading.Event) -> int:
    """One attempt of a co-training pool's job (`POOL_METHOD`): the scheduler placed it on its GPUs
    (CUDA_VISIBLE_DEVICES) like any trainer, and its lease is kept by the reporter's heartbeats.
    It loads the job's base model from the object store once and serves the pool until the control
    plane stops it (exit 0: the pool's job is cancelled first) or a preemption (SIGTERM: every hosted
    model's state handed back, exit PREEMPTED)."""
    from tuneforge.domain.exit_codes import TrainerExit
    from tuneforge.modeling.base import load_base_model
    from tuneforge.storage.model_cache import fetch_base_model
    from tuneforge.train.reporter import message_event

    extra = spec.extra
    base_dir = fetch_base_model(store, spec.base_model, Path(spec.cache_dir) if spec.cache_dir else None)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_base_model(base_dir, device)
    torch.manual_seed(0)
    reporter.report("events", message_event(f"co-training worker of {spec.base_model.name} serving on {device}",
                                            data={"code": "pool_serving", "device": str(device)}))
    outcome = serve({"pool_id": extra["pool_id"], "token": spec.job_token, "callback_url": spec.callback_url,
                     "base_name": spec.base_model.name, "base_source": spec.base_model.source},
                    SharedBase(model, tokenizer, max_pass_tokens=int(extra.get("max_pass_tokens") or 16384)), stop)
    log.info("pool %s: %s", extra["pool_id"], outcome)
    if outcome == "preempted":
        return TrainerExit.PREEMPTED
    return TrainerExit.SUCCESS if outcome == "stopped" else TrainerExit.PLATFORM_ERROR


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s cotrain %(levelname)s %(message)s")
    spec = json.loads(sys.stdin.read())
    from tuneforge.modeling.base import load_base_model

    device_name = spec.get("device") or "auto"
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device_name)
    model, tokenizer = load_base_model(Path(spec["base_dir"]), device)
    torch.manual_seed(0)
    serve(spec, SharedBase(model, tokenizer, max_pass_tokens=int(spec.get("max_pass_tokens") or 16384)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
