import json, math
import pytest
import tinker
from tinker import types

def test_probe(running, monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", f"{running.url}/tinker")
    monkeypatch.setenv("TINKER_API_KEY", f"tml-{running.key_a}")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    out = {}
    from tinker_cookbook.recipes import sl_basic, rl_basic
    for mod in (sl_basic, rl_basic):
        try:
            mod.build_config_blueprint("tiny-chat")
            out[mod.__name__] = "ok"
        except Exception as e:
            out[mod.__name__] = f"{type(e).__name__}: {e}"
    sc = tinker.ServiceClient()
    tc = sc.create_lora_training_client(base_model="tiny-chat", rank=8).result()
    info = tc.get_info()
    out["get_info"] = info.model_dump(mode="json")
    try:
        tok = tc.get_tokenizer()
        out["sdk_get_tokenizer"] = type(tok).__name__
    except Exception as e:
        out["sdk_get_tokenizer"] = f"{type(e).__name__}: {e}"
    caps = tinker.RestClient(base_url=f"{running.url}/tinker", api_key=f"tml-{running.key_a}").get_server_capabilities().result()
    out["caps"] = caps.model_dump(mode="json")
    # stable_reinforce path of rl_loop's default
    try:
        s = tc.save_weights_and_get_sampling_client(record_stability_info=True).result()
        r = s.sample(types.ModelInput.from_ints([5, 9, 14]), 2, types.SamplingParams(max_tokens=4, stop=["\n\nUser:"])).result()
        out["stability_sample"] = [(q.sequence_id, len(q.tokens)) for q in r.sequences]
        seq = r.sequences[0]
        toks = [5, 9, 14, *seq.tokens]
        d = types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                        loss_fn_inputs={"target_tokens": toks[1:], "logprobs": [0.0]*2 + list(seq.logprobs),
                                        "advantages": [0.0]*2 + [1.0]*len(seq.tokens)})
        d = d.with_provenance(model_input=[types.PromptProvenanceSpan(sequence_id=seq.sequence_id, length=3),
                                           types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=len(seq.tokens)-1)],
                              loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=1, length=2),
                                              types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=len(seq.tokens))])
        for loss in ("stable_reinforce", "cispo", "gspo", "ppo", "importance_sampling"):
            try:
                o = tc.forward_backward([d], loss).result()
                out["loss_"+loss] = o.metrics
            except Exception as e:
                out["loss_"+loss] = f"{type(e).__name__}: {e}"[:300]
    except Exception as e:
        out["stability"] = f"{type(e).__name__}: {e}"[:500]
    # ttl on save_state, delete_checkpoint, weights_info
    try:
        p = tc.save_state("ttl1", ttl_seconds=7200).result().path
        rc = tinker.RestClient(base_url=f"{running.url}/tinker", api_key=f"tml-{running.key_a}")
        ck = [c.model_dump(mode="json") for c in rc.list_checkpoints(tc.model_id).result().checkpoints]
        out["ckpt_ttl"] = ck
        rc.delete_checkpoint_from_tinker_path(p).result()
        out["deleted"] = [c.tinker_path for c in rc.list_checkpoints(tc.model_id).result().checkpoints]
        out["run"] = rc.get_training_run_by_tinker_path(p).result().model_dump(mode="json")
    except Exception as e:
        out["ttl"] = f"{type(e).__name__}: {e}"[:500]
    print("PROBE", json.dumps(out, default=str, indent=1))
