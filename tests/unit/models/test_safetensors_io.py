"""The one safetensors module: every dtype against the safetensors library, the streaming
writer, header bounds checks, shard planning and the index, and loading into models."""

from __future__ import annotations

import json
import struct
import weakref
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tiny_model_configs import make_config

from models import AutoModelForCausalLM
from models.common.config import ModelLoadError
from models.common.safetensors_io import (
    DTYPES,
    INDEX_FILE,
    CheckpointError,
    SafetensorsFileWriter,
    SafetensorsReader,
    TensorEntry,
    checkpoint_files,
    directory_specs,
    plan_shards,
    read_specs,
    read_tensors,
    save_safetensors,
    shard_file_names,
    write_file,
)
from models.llama.model import LlamaForCausalLM


def _random(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Arbitrary bit patterns of `dtype` (bool kept to 0/1, the only valid bytes)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * size), generator=generator)
    return raw.to(torch.uint8).view(dtype)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality: NaN patterns of the float types compare equal to themselves."""
    as_bytes = [t.contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(*as_bytes)


def _raw_file(path: Path, header: dict, data: bytes, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


# --- dtypes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("code", sorted(DTYPES))
def test_every_dtype_round_trips_with_the_safetensors_library(tmp_path: Path, code: str) -> None:
    dtype = DTYPES[code]
    tensors = {"m": _random(dtype, (3, 4)), "v": _random(dtype, (5,), seed=1)}
    if code != "F4":  # two packed 4-bit values per element: no 0-dim form
        tensors["s"] = _random(dtype, (1,), seed=2).reshape(())
    tensors["e"] = torch.empty((0, 2), dtype=dtype)
    ours = tmp_path / "ours.safetensors"
    write_file(ours, [TensorEntry.of(n, t) for n, t in tensors.items()], tensors.items())
    theirs = load_file(ours)
    assert theirs.keys() == tensors.keys()
    assert all(_same_bytes(theirs[name], t) for name, t in tensors.items())
    save_file(tensors, tmp_path / "theirs.safetensors")  # and the other way round
    back = dict(read_tensors(tmp_path / "theirs.safetensors"))
    assert all(_same_bytes(back[name], t) for name, t in tensors.items())


def test_the_dtype_table_covers_the_required_codes() -> None:
    required = "F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL U16 U32 U64 F8_E4M3 F8_E5M2 F8_E8M0"
    assert set(required.split()) <= set(DTYPES)


def test_mixed_dtypes_are_laid_out_aligned(tmp_path: Path) -> None:
    tensors = {"u8": torch.ones(3, dtype=torch.uint8), "f64": torch.ones(5, dtype=torch.float64)}
    tensors["bf16"] = torch.ones(1, dtype=torch.bfloat16)
    tensors["f32"] = torch.ones(3)
    save_safetensors(tmp_path, tensors.items())
    for spec in read_specs(tmp_path / "model.safetensors"):
        assert spec.start % torch.empty((), dtype=spec.dtype).element_size() == 0, spec.name


# --- the streaming writer --------------------------------------------------------------------
def test_the_writer_holds_one_lazily_made_tensor_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "lazy.safetensors"
    entries = [TensorEntry(f"t{i}", torch.float32, (64, 64)) for i in range(8)]
    made: list[weakref.ref] = []

    def produce():
        for i, entry in enumerate(entries):
            # The header is on disk before any value exists: it needs shapes only.
            (length,) = struct.unpack("<Q", path.read_bytes()[:8])
            assert entry.name in json.loads(path.read_bytes()[8 : 8 + length])
            alive = sum(ref() is not None for ref in made)
            assert alive <= 1, f"{alive} earlier tensors still alive when making t{i}"
            tensor = torch.full(entry.shape, float(i))
            made.append(weakref.ref(tensor))
            yield entry.name, tensor
            del tensor

    write_file(path, entries, produce())
    loaded = load_file(path)
    assert all(torch.equal(loaded[f"t{i}"], torch.full((64, 64), float(i))) for i in range(8))


def test_tensors_may_arrive_in_any_order(tmp_path: Path) -> None:
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7), "c": torch.tensor(1.5)}
    entries = [TensorEntry.of(n, t) for n, t in tensors.items()]
    write_file(tmp_path / "x.safetensors", entries, reversed(list(tensors.items())))
    loaded = load_file(tmp_path / "x.safetensors")
    assert all(torch.equal(loaded[n], t) for n, t in tensors.items())


def test_the_writer_refuses_what_the_header_does_not_declare(tmp_path: Path) -> None:
    entries = [TensorEntry("a", torch.float32, (2,)), TensorEntry("b", torch.float32, (2,))]
    writer = SafetensorsFileWriter(tmp_path / "x.safetensors", entries)
    with pytest.raises(ValueError, match="c is not declared"):
        writer.write("c", torch.zeros(2))
    with pytest.raises(ValueError, match=r"declares a as torch.float32 \(2,\)"):
        writer.write("a", torch.zeros(3))
    with pytest.raises(ValueError, match="declares a as torch.float32"):
        writer.write("a", torch.zeros(2, dtype=torch.float16))
    writer.write("a", torch.zeros(2))
    with pytest.raises(ValueError, match="a is written twice"):
        writer.write("a", torch.zeros(2))
    with pytest.raises(ValueError, match=r"never written: \['b'\]"):
        writer.close()
    packed = TensorEntry("q", torch.float4_e2m1fn_x2, ())
    with pytest.raises(ValueError, match="0-dim F4"):
        SafetensorsFileWriter(tmp_path / "y.safetensors", [packed])


# --- header bounds checks --------------------------------------------------------------------
def _f32(offsets: list[int], shape: list[int] | None = None) -> dict:
    return {"dtype": "F32", "shape": shape or [2], "data_offsets": offsets}


MALFORMED = {
    "header length too large": ({"a": _f32([0, 8])}, 8, 1 << 40, "over the 100000000-byte"),
    "header past the file end": ({"a": _f32([0, 8])}, 8, 4096, "runs past the end"),
    "offsets out of bounds": ({"a": _f32([0, 16], [4])}, 8, None, "fall outside"),
    "overlapping": ({"a": _f32([0, 8]), "b": _f32([4, 12])}, 12, None, "b overlaps a"),
    "wrong size": ({"a": _f32([0, 12])}, 12, None, "spans 12 bytes; F32 \\[2\\] needs 8"),
    "unknown dtype": ({"a": {"dtype": "F12", "shape": [2], "data_offsets": [0, 8]}}, 8, None,
                      "unknown dtype 'F12'"),
    "gap": ({"a": _f32([0, 8]), "b": _f32([12, 20])}, 20, None, "b follows unused bytes"),
    "trailing bytes": ({"a": _f32([0, 8])}, 12, None, "4 bytes after the tensors"),
    "negative offset": ({"a": _f32([-8, 0])}, 8, None, "not \\[start, end\\]"),
    "bad shape": ({"a": _f32([0, 8], ["2"])}, 8, None, "has shape"),
    "odd F4 shape": ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2, None,
                     "has shape"),
    "missing fields": ({"a": {"dtype": "F32"}}, 0, None, "needs dtype, shape and data_offsets"),
    "metadata not an object": ({"__metadata__": [1]}, 0, None, "__metadata__"),
}  # fmt: skip


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_headers_are_refused(tmp_path: Path, case: str) -> None:
    header, data_len, length, message = MALFORMED[case]
    path = _raw_file(tmp_path / "bad.safetensors", header, bytes(data_len), length)
    with pytest.raises(CheckpointError, match=message):
        read_specs(path)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    save_safetensors(tmp_path, [("a", torch.ones(16)), ("b", torch.ones(16))])
    path = tmp_path / "model.safetensors"
    whole = path.read_bytes()
    path.write_bytes(whole[:-10])  # the data section lost its tail
    with pytest.raises(CheckpointError, match="fall outside"):
        read_specs(path)
    path.write_bytes(whole[:20])  # the header itself is cut short
    with pytest.raises(CheckpointError, match="runs past the end"):
        read_specs(path)
    path.write_bytes(whole[:5])
    with pytest.raises(CheckpointError, match="truncated"):
        read_specs(path)


def test_bad_json_and_duplicate_names_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_specs(path)
    raw = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}'  # fmt: skip
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0\0")
    with pytest.raises(CheckpointError, match="duplicate keys"):
        read_specs(path)


def test_an_index_may_not_point_outside_its_directory(tmp_path: Path) -> None:
    index = {"metadata": {}, "weight_map": {"a": "../elsewhere.safetensors"}}
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="not a shard file name"):
        checkpoint_files(tmp_path)


# --- shards and the index --------------------------------------------------------------------
def test_shards_split_by_size() -> None:
    entries = [TensorEntry(str(i), torch.float32, (256,)) for i in range(5)]  # 1 KiB each
    assert [len(s) for s in plan_shards(entries, 2048)] == [2, 2, 1]
    assert [len(s) for s in plan_shards(entries, 100)] == [1] * 5  # oversized: alone
    assert plan_shards([], 100) == [[]]
    assert shard_file_names(1) == ["model.safetensors"]
    assert shard_file_names(2)[1] == "model-00002-of-00002.safetensors"


def test_shards_and_index_are_what_the_safetensors_library_reads(tmp_path: Path) -> None:
    tensors = {f"w{i}": torch.randn(256) for i in range(5)}
    tensors["big"] = torch.randn(1024, dtype=torch.float64)
    paths = save_safetensors(tmp_path, tensors.items(), max_shard_bytes=2048)
    assert [p.name for p in paths] == shard_file_names(4)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    assert index["weight_map"]["big"] == "model-00004-of-00004.safetensors"
    for name, file in index["weight_map"].items():
        assert torch.equal(load_file(tmp_path / file)[name], tensors[name])
    assert directory_specs(tmp_path).keys() == tensors.keys()


def test_a_tensor_in_two_shards_is_refused(tmp_path: Path) -> None:
    save_safetensors(tmp_path, [("a", torch.ones(4)), ("b", torch.ones(4))], max_shard_bytes=16)
    save_file({"a": torch.ones(4)}, tmp_path / "model-00002-of-00002.safetensors")
    with pytest.raises(CheckpointError, match="a is in both"):
        directory_specs(tmp_path)


def test_missing_shard_and_empty_directory(tmp_path: Path) -> None:
    save_safetensors(
        tmp_path / "s", [("a", torch.ones(4)), ("b", torch.ones(4))], max_shard_bytes=16
    )
    (tmp_path / "s" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        checkpoint_files(tmp_path / "s")
    (tmp_path / "e").mkdir()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        checkpoint_files(tmp_path / "e")


# --- loading into models ---------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path: Path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config("llama"))
    model.save_pretrained(tmp_path / "ckpt")
    return model, tmp_path / "ckpt"


def test_sharded_save_writes_an_index_transformers_reads(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config("qwen3_moe"))
    model.save_pretrained(tmp_path, max_shard_size=50_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert len(checkpoint_files(tmp_path)) > 2
    assert set(index["weight_map"]) == set(model.hf_load_targets())
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.randint(1, 512, (1, 10))
    torch.testing.assert_close(model(input_ids=ids).logits, hf(input_ids=ids).logits)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)


def test_reads_land_in_the_parameters_own_storage(saved) -> None:
    model, directory = saved
    fresh = AutoModelForCausalLM.from_config(make_config("llama"))
    param = fresh.model.layers[0].self_attn.q_proj.weight
    pointer = param.data_ptr()
    with SafetensorsReader(directory) as reader:
        reader.read_into("model.layers.0.self_attn.q_proj.weight", param.data)
    assert param.data_ptr() == pointer
    assert torch.equal(param, model.model.layers[0].self_attn.q_proj.weight)


def test_checkpoint_dtype_converts_on_load(saved) -> None:
    model, directory = saved
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype="bfloat16")
    weight = loaded.model.embed_tokens.weight
    assert weight.dtype is torch.bfloat16
    assert torch.equal(weight, model.model.embed_tokens.weight.to(torch.bfloat16))
    assert not loaded.training  # from_pretrained returns eval mode, as transformers does


def test_missing_and_unexpected_keys_are_refused(saved) -> None:
    _, directory = saved
    tensors = load_file(directory / "model.safetensors")
    tensors.pop("model.norm.weight")
    tensors["model.extra.weight"] = torch.zeros(2)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"missing \['model.norm.weight'\].*unexpected"):
        AutoModelForCausalLM.from_pretrained(directory)


def test_shape_mismatch_is_refused(saved, tmp_path: Path) -> None:
    _, directory = saved
    bigger = AutoModelForCausalLM.from_config(make_config("llama", intermediate_size=256))
    bigger.save_pretrained(tmp_path / "big")
    (directory / "model.safetensors").replace(tmp_path / "theirs.safetensors")
    (tmp_path / "big" / "model.safetensors").replace(directory / "model.safetensors")
    with pytest.raises(ModelLoadError, match="pretrained_model_name_or_path: .*checkpoint shape"):
        AutoModelForCausalLM.from_pretrained(directory)
    with pytest.raises(CheckpointError, match="checkpoint shape"):  # the native class itself
        LlamaForCausalLM.from_pretrained(directory)


def test_a_malformed_file_is_a_model_load_error(saved) -> None:
    _, directory = saved
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ModelLoadError, match="fall outside"):
        AutoModelForCausalLM.from_pretrained(directory)
