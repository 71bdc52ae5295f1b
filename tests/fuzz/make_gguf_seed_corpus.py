#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/gguf_fuzzer.cc into tests/fuzz/corpus/gguf_fuzzer/: a few
small valid GGUF files (every value type, an aligned quantized tensor, a vocabulary) and broken
ones, each under 2 KB. Written here, from the GGUF specification, independently of the C++ writer.
Deterministic: a rerun shows no diff. Usage: tests/fuzz/make_gguf_seed_corpus.py [OUT_DIR]"""
import os
import struct
import sys


def s(v):
    b = v.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, type_id, payload):
    return s(key) + struct.pack("<I", type_id) + payload


def tensor(name, dims, type_id, offset):
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) \
        + struct.pack("<IQ", type_id, offset)


def gguf(kvs, tensors, data, alignment=32, version=3):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs) \
        + b"".join(tensors)
    return out + b"\0" * (-len(out) % alignment) + data


ALL_TYPES = [
    kv("general.architecture", 8, s("llama")),
    kv("t.u8", 0, struct.pack("<B", 200)), kv("t.i8", 1, struct.pack("<b", -5)),
    kv("t.u16", 2, struct.pack("<H", 60000)), kv("t.i16", 3, struct.pack("<h", -3)),
    kv("llama.context_length", 4, struct.pack("<I", 512)), kv("t.i32", 5, struct.pack("<i", -7)),
    kv("t.f32", 6, struct.pack("<f", 1.5)), kv("t.bool", 7, b"\x01"),
    kv("t.u64", 10, struct.pack("<Q", 1 << 40)), kv("t.i64", 11, struct.pack("<q", -(1 << 40))),
    kv("t.f64", 12, struct.pack("<d", 0.25)),
    kv("t.ai32", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3)),
    kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + s("<unk>") + s("<s>") + s("é")),
]
F32_3 = struct.pack("<3f", 1, 2, 3) + b"\0" * 20  # 12 bytes, padded to 32
Q8_0_2 = bytes(range(68)) + b"\0" * 28             # two Q8_0 blocks, padded
VALID = gguf(ALL_TYPES, [tensor("a", [3], 0, 0), tensor("q", [32, 2], 8, 32)], F32_3 + Q8_0_2)

files = {
    "valid_all_types": VALID,
    "valid_align64_q4_0": gguf(
        [kv("general.alignment", 4, struct.pack("<I", 64)), kv("general.architecture", 8, s("qwen2"))],
        [tensor("blk.0.attn_q.weight", [32, 2], 2, 0), tensor("b", [4], 30, 64)],
        bytes(36) + b"\0" * 28 + bytes(8), alignment=64),
    "valid_vocab_only": gguf(
        [kv("general.architecture", 8, s("llama")),
         kv("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 2) + s("a b") + s("ab c"))], [], b""),
    "valid_v2": gguf([kv("general.architecture", 8, s("llama"))], [tensor("x", [2, 2], 1, 0)],
                     bytes(8), version=2),
    "broken_truncated": VALID[: len(VALID) - 40],
    "broken_v1": gguf([], [], b"", version=1),
    "broken_huge_tensor_count": b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0) + bytes(32),
    "broken_huge_array": gguf([kv("k", 9, struct.pack("<IQ", 4, 1 << 62))], [], b""),
    "broken_n_dims_5": gguf([], [tensor("w", [1] * 5, 0, 0)], bytes(32)),
    "broken_unknown_type": gguf([], [tensor("w", [32], 16, 0)], bytes(32)),
    "broken_misaligned": gguf([], [tensor("w", [4], 0, 8)], bytes(64)),
    "broken_overlap": gguf([], [tensor("a", [16], 0, 0), tensor("b", [4], 0, 32)], bytes(128)),
    "broken_duplicate_key": gguf([kv("k", 4, bytes(4)), kv("k", 4, bytes(4))], [], b""),
    "broken_alignment_3": gguf([kv("general.alignment", 4, struct.pack("<I", 3))], [], b""),
}

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf_fuzzer")
os.makedirs(out, exist_ok=True)
for name, data in files.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
