#!/usr/bin/env python3
"""Writes the hand-made seeds of tests/fuzz/corpus/safetensors (valid-* and invalid-*).

The replay test (test_safetensors.cpp) checks that valid-* files open and invalid-* files are
rejected, and the same for json-valid-* / json-invalid-* in the fuzzer's second form (JSON
header, NUL, data); files the fuzzer adds (named by their SHA-1) may be anything. Rerun after changing a seed:
    python3 tests/fuzz/make_seed_corpus.py
"""
import json
import os
import struct

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")


def header_json(entries, metadata=None):
    root = {}
    if metadata is not None:
        root["__metadata__"] = metadata
    root.update(entries)
    return json.dumps(root, separators=(",", ":")).encode()


def safetensors(header, data=b"", header_length=None, pad=True):
    if pad:
        header += b" " * ((8 - len(header) % 8) % 8)
    n = len(header) if header_length is None else header_length
    return struct.pack("<Q", n) + header + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def main():
    os.makedirs(CORPUS, exist_ok=True)
    f32 = struct.pack("<6f", 1.5, -2.0, 3.25, 0.0, 1e-30, -7.0)
    seeds = {
        "valid-all-dtypes": safetensors(
            header_json(
                {
                    "w": entry("F32", [2, 3], 0, 24),
                    "b": entry("BF16", [2], 24, 28),
                    "d": entry("F64", [1], 28, 36),
                    "i": entry("I32", [1, 1], 36, 40),
                    "l": entry("I64", [1], 40, 48),
                    "u": entry("U8", [3], 48, 51),
                },
                {"format": "pt"},
            ),
            f32 + b"\x80\x3f\x00\xc0" + struct.pack("<d", 2.5) + struct.pack("<i", -3)
            + struct.pack("<q", 1 << 40) + b"\x00\x7f\xff",
        ),
        "valid-empty": safetensors(b"{}"),
        "valid-metadata-only": safetensors(header_json({}, {"step": "1200", "note": "\u00e9"})),
        "valid-zero-size-and-scalar": safetensors(
            header_json(
                {
                    "e": entry("F32", [0, 4], 0, 0),
                    "s": entry("F32", [], 0, 4),
                    "z": entry("U8", [3, 0], 4, 4),
                }
            ),
            struct.pack("<f", 42.0),
        ),
        "valid-foreign-unpadded": safetensors(
            b'{"b":{"data_offsets":[4,12],"shape":[2],"dtype":"I32"},'
            b'"a":{"shape":[],"dtype":"I32","data_offsets":[0,4]}}',
            struct.pack("<3i", 7, 8, 9),
            pad=False,
        ),
        "invalid-empty-file": b"",
        "invalid-short": b"\x02\x00\x00",
        "invalid-header-past-end": safetensors(b"{}", header_length=64),
        "invalid-header-huge": safetensors(b"{}", header_length=1 << 62),
        "invalid-overlap": safetensors(
            header_json({"a": entry("U8", [6], 0, 6), "b": entry("U8", [4], 4, 8)}), b"01234567"
        ),
        "invalid-gap": safetensors(
            header_json({"a": entry("U8", [2], 0, 2), "b": entry("U8", [4], 4, 8)}), b"01234567"
        ),
        "invalid-trailing": safetensors(header_json({"a": entry("U8", [6], 0, 6)}), b"01234567"),
        "invalid-reversed": safetensors(header_json({"a": entry("U8", [0], 8, 0)}), b"01234567"),
        "invalid-past-end": safetensors(header_json({"a": entry("U8", [16], 0, 16)}), b"01234567"),
        "invalid-dtype": safetensors(header_json({"h": entry("F16", [4], 0, 8)}), b"01234567"),
        "invalid-shape-mismatch": safetensors(
            header_json({"s": entry("F32", [3], 0, 8)}), b"01234567"
        ),
        "invalid-shape-overflow": safetensors(
            header_json({"o": entry("U8", [1 << 32, 1 << 32, 8], 0, 8)}), b"01234567"
        ),
        "invalid-negative-dim": safetensors(
            header_json({"n": entry("U8", [-8], 0, 8)}), b"01234567"
        ),
        "invalid-float-dim": safetensors(
            b'{"f":{"dtype":"U8","shape":[8.0],"data_offsets":[0,8]}}', b"01234567"
        ),
        "invalid-not-object": safetensors(b"[1,2]"),
        "invalid-not-json": safetensors(b'{"a":'),
        "invalid-repeated-key": safetensors(
            b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
            b'"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
            b"01234567",
        ),
        "invalid-deep": safetensors(b"[" * 64 + b"]" * 64),
        "invalid-missing-key": safetensors(b'{"m":{"dtype":"U8","shape":[8]}}', b"01234567"),
        "invalid-extra-key": safetensors(
            b'{"m":{"dtype":"U8","shape":[8],"data_offsets":[0,8],"x":1}}', b"01234567"
        ),
        "invalid-metadata-number": safetensors(b'{"__metadata__":{"k":1}}'),
        "invalid-utf8-name": safetensors(
            b'{"\xff":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}', b"01234567"
        ),
        "invalid-offsets-arity": safetensors(
            b'{"m":{"dtype":"U8","shape":[8],"data_offsets":[0,4,8]}}', b"01234567"
        ),
    }
    # The fuzzer's second form: JSON header, NUL, data buffer (safetensors_check.h).
    seeds["json-valid-two"] = (
        header_json({"a": entry("F32", [2], 0, 8), "b": entry("U8", [3], 8, 11)},
                    {"k": "v"}) + b"\0" + struct.pack("<2f", 1.0, 2.0) + b"xyz"
    )
    seeds["json-valid-bare"] = b'{"t":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]}}\0' + (
        b"\x01" * 8
    )
    seeds["json-invalid-overlap"] = (
        header_json({"a": entry("U8", [6], 0, 6), "b": entry("U8", [4], 4, 8)}) + b"\0" + b"0" * 8
    )
    for name, data in seeds.items():
        with open(os.path.join(CORPUS, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {CORPUS}")


if __name__ == "__main__":
    main()
