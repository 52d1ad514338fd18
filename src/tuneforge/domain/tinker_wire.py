"""The protobuf messages of the Tinker training API, read and written by hand (proto3 wire format).

The training API's SDK sends `forward_backward` bodies as a `ForwardBackwardRequest` message and
wants `ForwardBackwardOutput` and `SampleResponse` results back as messages. Only these few
messages are needed, and they use four wire types, so they are decoded and encoded here directly
rather than through generated code. Field numbers are the wire contract (docs/tinker-wire.md §4).

Decoding is bounded by what it is given: every length is checked against the bytes left, the
nesting is fixed by the schema (no recursion on tenant input), and the caller bounds the body's
size before it gets here. Anything malformed raises `WireError` naming the field.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass, field

DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
STOP_REASON_STOP, STOP_REASON_LENGTH = 0, 1
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
MAX_TENSOR_ELEMENTS = 1 << 26  # a dense shape past this is refused before anything is allocated


_SWAP = sys.byteorder != "little"  # the wire's numbers are little-endian; `array` uses the host's order


def _le(code: str, values: list) -> bytes:
    packed = array(code, values)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


class WireError(ValueError):
    pass


@dataclass
class Tensor:
    dtype: str  # "int64" | "float32"
    shape: list[int]
    values: list[float] | list[int]  # flat, row-major, len = prod(shape)


@dataclass
class Datum:
    tokens: list[int]
    inputs: dict[str, Tensor]
    other_chunks: int = 0  # image / dmel chunks (not served here)


@dataclass
class ForwardBackwardRequest:
    model_id: str = ""
    seq_id: int = 0
    data: list[Datum] = field(default_factory=list)
    loss_fn: str = ""
    loss_fn_config: dict[str, float] = field(default_factory=dict)
    forward_only: bool = False
    loss_fn_config_text: dict[str, str] = field(default_factory=dict)


# reading ------------------------------------------------------------------------------------------
def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: memoryview, where: str) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) in order: an int for varints and fixed, a memoryview for bytes."""
    out: list[tuple[int, int, object]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError(f"{where}: field number 0")
        if kind == _VARINT:
            value, at = _varint(data, at)
            out.append((number, kind, value))
        elif kind == _FIXED64:
            if at + 8 > len(data):
                raise WireError(f"{where}: truncated field {number}")
            out.append((number, kind, bytes(data[at:at + 8])))
            at += 8
        elif kind == _FIXED32:
            if at + 4 > len(data):
                raise WireError(f"{where}: truncated field {number}")
            out.append((number, kind, bytes(data[at:at + 4])))
            at += 4
        elif kind == _BYTES:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise WireError(f"{where}: field {number} runs past the end of the message")
            out.append((number, kind, data[at:at + length]))
            at += length
        else:
            raise WireError(f"{where}: unsupported wire type {kind} (field {number})")
    return out


def _text(value: object, where: str) -> str:
    if not isinstance(value, memoryview):
        raise WireError(f"{where}: expected a string")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"{where}: not UTF-8") from exc


def _nested(value: object, where: str) -> memoryview:
    if not isinstance(value, memoryview):
        raise WireError(f"{where}: expected a message")
    return value


def _signed(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def _packed_int64(value: object, kind: int, where: str) -> list[int]:
    if kind == _VARINT:
        return [_signed(int(value))]  # type: ignore[call-overload]
    view = _nested(value, where)
    out, at = [], 0
    while at < len(view):
        item, at = _varint(view, at)
        out.append(_signed(item))
    return out


def _numbers(raw: bytes, dtype: int, where: str) -> list[float] | list[int]:
    codes = {DTYPE_FLOAT32: ("f", 4), DTYPE_INT64: ("q", 8), DTYPE_INT32: ("i", 4)}
    if dtype not in codes:
        raise WireError(f"{where}: dtype {dtype} is not float32, int64 or int32")
    code, size = codes[dtype]
    if len(raw) % size:
        raise WireError(f"{where}: {len(raw)} bytes is not a whole number of {code} values")
    values = array(code)
    values.frombytes(raw)
    if _SWAP:
        values.byteswap()
    return values.tolist()


def _tensor(data: memoryview, where: str) -> Tensor:
    dense: bytes | None = None
    sparse: memoryview | None = None
    dtype = 0
    shape: list[int] = []
    for number, kind, value in _fields(data, where):
        if number == 1:
            dense = bytes(_nested(value, where))
        elif number == 2:
            sparse = _nested(value, where)
        elif number == 3:
            dtype = int(value)  # type: ignore[call-overload]
        elif number == 4:
            shape.extend(_packed_int64(value, kind, f"{where}.shape"))
    if any(dim < 0 for dim in shape):
        raise WireError(f"{where}.shape has a negative dimension")
    count = 1
    for dim in shape:
        count *= dim
        if count > MAX_TENSOR_ELEMENTS:
            raise WireError(f"{where}.shape {shape} is too large")
    name = "float32" if dtype == DTYPE_FLOAT32 else "int64"
    if dtype == DTYPE_BFLOAT16:
        raise WireError(f"{where}: bfloat16 tensors are not accepted; send float32")
    if sparse is None:
        values = _numbers(dense or b"", dtype, where)
        if not shape:
            shape = [len(values)]
        if len(values) != count:
            raise WireError(f"{where}: {len(values)} values for shape {shape}")
        return Tensor(name, shape, values)
    if len(shape) != 2:
        raise WireError(f"{where}: a sparse tensor needs a 2-D shape")
    parts = {number: bytes(_nested(value, where)) for number, _kind, value in _fields(sparse, f"{where}.sparse_csr")}
    values = _numbers(parts.get(1, b""), dtype, f"{where}.sparse_csr.values")
    crow = _numbers(parts.get(2, b""), DTYPE_INT64, f"{where}.sparse_csr.crow_indices")
    col = _numbers(parts.get(3, b""), DTYPE_INT64, f"{where}.sparse_csr.col_indices")
    rows, cols = shape
    if len(crow) != rows + 1 or len(col) != len(values) or crow[0] != 0 or crow[-1] != len(values) \
            or any(b < a for a, b in zip(crow, crow[1:])) or any(not 0 <= c < cols for c in col):
        raise WireError(f"{where}.sparse_csr is not a valid CSR matrix of shape {shape}")
    flat: list = [0.0 if name == "float32" else 0] * count
    for row in range(rows):
        for at in range(int(crow[row]), int(crow[row + 1])):
            flat[row * cols + int(col[at])] = values[at]
    return Tensor(name, shape, flat)


def _map_entry(data: memoryview, where: str) -> tuple[str, object, int]:
    key, value, kind = "", None, -1
    for number, entry_kind, item in _fields(data, where):
        if number == 1:
            key = _text(item, f"{where}.key")
        elif number == 2:
            value, kind = item, entry_kind
    return key, value, kind


def _double(value: object, kind: int, where: str) -> float:
    if kind != _FIXED64 or not isinstance(value, bytes):
        raise WireError(f"{where}: expected a double")
    return float(struct.unpack("<d", value)[0])


def _datum(data: memoryview, where: str) -> Datum:
    datum = Datum([], {})
    for number, _kind, value in _fields(data, where):
        if number == 1:
            for chunk_number, _ck, chunk in _fields(_nested(value, f"{where}.model_input"), f"{where}.model_input"):
                if chunk_number == 1:
                    for token_number, _tk, raw in _fields(_nested(chunk, where), f"{where}.encoded_text"):
                        if token_number == 1:
                            datum.tokens.extend(_numbers(bytes(_nested(raw, where)), DTYPE_INT32, where))  # type: ignore[arg-type]
                else:
                    datum.other_chunks += 1
        elif number == 2:
            key, item, _ik = _map_entry(_nested(value, where), f"{where}.loss_fn_inputs")
            datum.inputs[key] = _tensor(_nested(item or memoryview(b""), where), f"{where}.loss_fn_inputs.{key}")
    return datum


def decode_forward_backward(body: bytes) -> ForwardBackwardRequest:
    request = ForwardBackwardRequest()
    view = memoryview(body)
    for number, _kind, value in _fields(view, "ForwardBackwardRequest"):
        if number == 1:
            request.model_id = _text(value, "model_id")
        elif number == 2:
            request.seq_id = _signed(int(value))  # type: ignore[call-overload]
        elif number == 3:
            request.data.append(_datum(_nested(value, "data"), f"data[{len(request.data)}]"))
        elif number == 4:
            request.loss_fn = _text(value, "loss_fn")
        elif number == 5:
            key, item, item_kind = _map_entry(_nested(value, "loss_fn_config"), "loss_fn_config")
            request.loss_fn_config[key] = _double(item, item_kind, f"loss_fn_config.{key}")
        elif number == 6:
            request.forward_only = bool(value)
        elif number == 7:
            key, item, _ik = _map_entry(_nested(value, "loss_fn_config_v2"), "loss_fn_config_v2")
            for inner, inner_kind, inner_value in _fields(_nested(item or memoryview(b""), key), key):
                if inner == 1:
                    request.loss_fn_config[key] = _double(inner_value, inner_kind, f"loss_fn_config_v2.{key}")
                elif inner == 2:
                    request.loss_fn_config_text[key] = _text(inner_value, f"loss_fn_config_v2.{key}")
    return request


# writing ------------------------------------------------------------------------------------------
def _put_varint(out: bytearray, value: int) -> None:
    value &= 0xFFFFFFFFFFFFFFFF
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _put_key(out: bytearray, number: int, kind: int) -> None:
    _put_varint(out, number << 3 | kind)


def _put_bytes(out: bytearray, number: int, data: bytes) -> None:
    _put_key(out, number, _BYTES)
    _put_varint(out, len(data))
    out += data


def _put_int(out: bytearray, number: int, value: int) -> None:
    if value:
        _put_key(out, number, _VARINT)
        _put_varint(out, value)


def _put_packed(out: bytearray, number: int, values: list[int]) -> None:
    if values:
        packed = bytearray()
        for value in values:
            _put_varint(packed, value)
        _put_bytes(out, number, bytes(packed))


def _double_entry(key: str, value: float) -> bytes:
    entry = bytearray()
    _put_bytes(entry, 1, key.encode())
    _put_key(entry, 2, _FIXED64)
    entry += struct.pack("<d", value)
    return bytes(entry)


@dataclass
class OutputField:
    """One output of every datum (e.g. its target logprobs): float32, each datum's flat values and
    the shape after the first dimension."""

    per_datum: list[list[float]]
    trailing_shape: list[int] = field(default_factory=list)


def encode_forward_backward_output(fields: dict[str, OutputField], metrics: dict[str, float]) -> bytes:
    record = bytearray()
    _put_bytes(record, 1, b"ArrayRecord")
    count = 0
    for name, output in fields.items():
        data, offsets = bytearray(), [0]
        for values in output.per_datum:
            data += _le("f", values)
            offsets.append(len(data))
        count = len(output.per_datum)
        tensor = bytearray()
        _put_bytes(tensor, 1, bytes(data))
        _put_bytes(tensor, 2, _le("q", offsets))
        _put_int(tensor, 3, DTYPE_FLOAT32)
        _put_packed(tensor, 4, output.trailing_shape)
        entry = bytearray()
        _put_bytes(entry, 1, name.encode())
        _put_bytes(entry, 2, bytes(tensor))
        _put_bytes(record, 2, bytes(entry))
    _put_int(record, 3, count)
    out = bytearray()
    _put_bytes(out, 1, b"ArrayRecord")
    _put_bytes(out, 2, bytes(record))
    for key, value in metrics.items():
        _put_bytes(out, 3, _double_entry(key, value))
    return bytes(out)


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool


def encode_sample_response(sequences: list[SampledSequence], prompt_logprobs: list[float] | None) -> bytes:
    out = bytearray()
    for sequence in sequences:
        item = bytearray()
        _put_int(item, 1, STOP_REASON_STOP if sequence.stopped else STOP_REASON_LENGTH)
        _put_bytes(item, 2, _le("i", sequence.tokens))
        _put_bytes(item, 3, _le("f", sequence.logprobs))
        _put_bytes(out, 1, bytes(item))
    if prompt_logprobs is not None:
        _put_bytes(out, 2, _le("f", prompt_logprobs))
    return bytes(out)
