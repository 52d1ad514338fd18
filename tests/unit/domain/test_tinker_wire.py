"""The hand-written Tinker wire codec reads what the SDK's own generated messages write, and writes
what they read (the SDK is a test dependency; its generated module is the reference)."""

from __future__ import annotations

import math
import struct

import pytest

from tuneforge.domain.tinker_wire import (
    OutputField,
    SampledSequence,
    WireError,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)

pb = pytest.importorskip("tinker.proto.tinker_public_pb2")


def dense(dtype: int, values: list, code: str) -> object:
    return pb.Tensor(dense=struct.pack(f"<{len(values)}{code}", *values), dtype=dtype, shape=[len(values)])


def test_a_forward_backward_request_written_by_the_sdk_reads_back_field_for_field() -> None:
    message = pb.ForwardBackwardRequest(model_id="s1:train:0", seq_id=7, loss_fn="ppo", forward_only=True)
    message.loss_fn_config["clip_low_threshold"] = 0.8
    message.loss_fn_config_v2["clip_high_threshold"].number = 1.25
    message.loss_fn_config_v2["mode"].text = "token"
    first = message.data.add()
    first.model_input.add().encoded_text.tokens = struct.pack("<3i", 1, 2, 3)
    first.model_input.add().encoded_text.tokens = struct.pack("<1i", 40000)
    first.loss_fn_inputs["target_tokens"].CopyFrom(dense(pb.DTYPE_INT64, [2, 3, 4, -1], "q"))
    first.loss_fn_inputs["weights"].CopyFrom(dense(pb.DTYPE_FLOAT32, [0.0, 1.0, -2.5, 0.5], "f"))
    second = message.data.add()
    second.model_input.add().encoded_text.tokens = struct.pack("<2i", 9, 8)
    sparse = second.loss_fn_inputs["weights"]
    sparse.dtype = pb.DTYPE_FLOAT32
    sparse.shape.extend([2, 3])
    sparse.sparse_csr.values = struct.pack("<2f", 1.5, -1.0)
    sparse.sparse_csr.crow_indices = struct.pack("<3q", 0, 1, 2)
    sparse.sparse_csr.col_indices = struct.pack("<2q", 2, 0)
    second.model_input.add().image.data = b"png"

    decoded = decode_forward_backward(message.SerializeToString())
    assert (decoded.model_id, decoded.seq_id, decoded.loss_fn, decoded.forward_only) == ("s1:train:0", 7, "ppo", True)
    assert decoded.loss_fn_config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.25}
    assert decoded.loss_fn_config_text == {"mode": "token"}
    assert decoded.data[0].tokens == [1, 2, 3, 40000]
    targets = decoded.data[0].inputs["target_tokens"]
    assert (targets.dtype, targets.shape, targets.values) == ("int64", [4], [2, 3, 4, -1])
    assert decoded.data[0].inputs["weights"].values == [0.0, 1.0, -2.5, 0.5]
    assert decoded.data[1].tokens == [9, 8] and decoded.data[1].other_chunks == 1
    weights = decoded.data[1].inputs["weights"]
    assert (weights.shape, weights.values) == ([2, 3], [0.0, 0.0, 1.5, -1.0, 0.0, 0.0])


def test_a_negative_seq_id_and_an_empty_message_read_as_proto3_says() -> None:
    assert decode_forward_backward(pb.ForwardBackwardRequest(seq_id=-3).SerializeToString()).seq_id == -3
    empty = decode_forward_backward(b"")
    assert (empty.model_id, empty.seq_id, empty.data, empty.forward_only) == ("", 0, [], False)


@pytest.mark.parametrize("body", [
    b"\x0a\x05ab",  # a string longer than what is left
    b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a varint that never ends
    b"\x1b",  # wire type 3 (groups)
    b"\x1a\x06\x12\x04\x0a\x02\x12\x00",  # a datum whose tensor map entry is cut
])
def test_malformed_bodies_raise_a_wire_error_not_anything_else(body: bytes) -> None:
    with pytest.raises(WireError):
        decode_forward_backward(body)


def test_a_tensor_whose_shape_does_not_fit_its_values_or_is_huge_is_refused() -> None:
    message = pb.ForwardBackwardRequest()
    datum = message.data.add()
    datum.loss_fn_inputs["weights"].CopyFrom(pb.Tensor(dense=struct.pack("<2f", 1, 2), dtype=pb.DTYPE_FLOAT32,
                                                       shape=[3]))
    with pytest.raises(WireError, match=r"data\[0\].loss_fn_inputs.weights: 2 values for shape \[3\]"):
        decode_forward_backward(message.SerializeToString())
    datum.loss_fn_inputs["weights"].CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[1 << 20, 1 << 20]))
    with pytest.raises(WireError, match="too large"):
        decode_forward_backward(message.SerializeToString())


def test_the_forward_backward_output_reads_in_the_sdk_as_written() -> None:
    body = encode_forward_backward_output(
        {"logprobs": OutputField([[-0.5, -1.0], [-2.0, -0.25, -3.0]]),
         "elementwise_loss": OutputField([[0.5, 1.0], [2.0, 0.25, 3.0]])},
        {"loss:sum": 6.75})
    message = pb.ForwardBackwardOutput.FromString(body)
    assert message.metrics["loss:sum"] == 6.75 and message.loss_fn_output_type == "ArrayRecord"
    (record,) = message.loss_fn_outputs
    assert record.num_datums == 2
    logprobs = record.fields["logprobs"]
    assert logprobs.dtype == pb.DTYPE_FLOAT32
    assert struct.unpack("<3q", logprobs.offsets) == (0, 8, 20)
    assert struct.unpack("<5f", logprobs.data) == (-0.5, -1.0, -2.0, -0.25, -3.0)


def test_the_sample_response_reads_in_the_sdk_as_written() -> None:
    body = encode_sample_response([SampledSequence([5, 6, 7], [-0.1, -0.2, -0.3], True),
                                   SampledSequence([8], [-1.5], False)], [math.nan, -2.0, -0.5])
    message = pb.SampleResponse.FromString(body)
    first, second = message.sequences
    assert first.stop_reason == pb.STOP_REASON_STOP and second.stop_reason == pb.STOP_REASON_LENGTH
    assert struct.unpack("<3i", first.tokens) == (5, 6, 7)
    assert struct.unpack("<1f", second.logprobs) == (-1.5,)
    prompt = struct.unpack("<3f", message.prompt_logprobs)
    assert math.isnan(prompt[0]) and prompt[1:] == (-2.0, -0.5)
