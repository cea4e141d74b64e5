"""Reference data for moetron's low-precision formats (tests/test_kernels_quantize.cpp).

An implementation independent of the C++ one: element conversions by ml_dtypes (float8_e4m3fn,
bfloat16), the scale rules written from their published descriptions with exact arithmetic
(math.frexp, numpy float32), not from moetron's code:

- MXFP8 (OCP MX v1.0 blocks of 32, Transformer Engine's MXFP8BlockScaling scale): e8m0 =
  127 + ceil(log2(amax * fl32(1/448))) clamped to [0, 254]; elements e4m3(x * 2^(127 - e8m0))
  (x * 1 when e8m0 = 0), saturating at +-448; NaN elements stay NaN, NaN never counts in amax.
- DeepSeek-V3 FP8 (report section 3.3): scale = fl32(amax / 448), 1 when that is 0; elements
  e4m3(x / scale), saturating.

    pip install ml_dtypes numpy
    python tools/reference/make_quantize_reference.py   # --out tests/data/quantize_reference.bin

Two runs write the same bytes (fixed seed).
"""
import argparse
import math
import pathlib

import ml_dtypes
import numpy as np

from mtref import write_reference

E4M3_MAX = np.float32(448.0)
E4M3_NAN_CODE = 0x7F  # moetron writes the positive NaN pattern whatever the input's sign
SEED = 20261201


def e4m3_codes(scaled: np.ndarray) -> np.ndarray:
    """float32 -> E4M3 codes, round to nearest even, saturating (the GPU's cvt.rn.satfinite)."""
    clipped = np.clip(scaled, -E4M3_MAX, E4M3_MAX)  # NaN stays NaN; +-Inf -> +-448
    codes = clipped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).astype(np.int32)
    codes[np.isnan(scaled)] = E4M3_NAN_CODE
    return codes


def e4m3_values(codes: np.ndarray) -> np.ndarray:
    return codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def e8m0_round_up(value: np.float32) -> int:
    """The smallest 2^e >= value, as a biased E8M0 code (NaN 255; above 2^127 and Inf: 254)."""
    if math.isnan(value):
        return 255
    if math.isinf(value) or value > 2.0**127:
        return 254
    if value == 0:
        return 0
    mantissa, exponent = math.frexp(float(value))  # value = mantissa * 2^exponent, m in [0.5, 1)
    ceil_log2 = exponent - 1 if mantissa == 0.5 else exponent
    return min(254, max(0, ceil_log2 + 127))


def tile_amax(tile: np.ndarray) -> np.float32:
    magnitudes = np.abs(tile)
    magnitudes[np.isnan(magnitudes)] = 0
    return np.float32(magnitudes.max()) if magnitudes.size else np.float32(0)


def quantize(x: np.ndarray, block_rows: int, block_cols: int, rule: str):
    rows, cols = x.shape
    scale_rows, scale_cols = -(-rows // block_rows), -(-cols // block_cols)
    codes = np.zeros(x.shape, np.int32)
    dequantized = np.zeros(x.shape, np.float32)
    scales = np.zeros((scale_rows, scale_cols), np.int32 if rule == "mxfp8" else np.float32)
    for i in range(scale_rows):
        for j in range(scale_cols):
            window = (slice(i * block_rows, (i + 1) * block_rows),
                      slice(j * block_cols, (j + 1) * block_cols))
            tile = x[window]
            amax = tile_amax(tile)
            if rule == "mxfp8":
                e8m0 = e8m0_round_up(np.float32(amax * np.float32(1.0 / 448.0)))
                multiplier = np.float32(1.0) if e8m0 == 0 else np.float32(2.0 ** (127 - e8m0))
                tile_codes = e4m3_codes((tile * multiplier).astype(np.float32))
                with np.errstate(over="ignore"):  # 448 x 2^127 is Inf in float32, as in C++
                    tile_values = e4m3_values(tile_codes) * np.float32(2.0 ** (e8m0 - 127))
                scales[i, j] = e8m0
            else:
                scale = np.float32(amax / E4M3_MAX)
                if not scale > 0:
                    scale = np.float32(1.0)
                with np.errstate(invalid="ignore"):
                    tile_codes = e4m3_codes((tile / scale).astype(np.float32))
                    tile_values = e4m3_values(tile_codes) * scale
                scales[i, j] = scale
            codes[window] = tile_codes
            dequantized[window] = tile_values.astype(np.float32)
    return codes, scales, dequantized


def matrices(rng: np.random.Generator) -> dict[str, np.ndarray]:
    # Random values whose magnitudes vary by row and column (so scales differ between tiles).
    random = rng.standard_normal((20, 160)).astype(np.float32)
    random *= np.float32(2.0) ** rng.integers(-20, 21, size=(20, 1)).astype(np.float32)
    random *= np.float32(2.0) ** rng.integers(-3, 4, size=(1, 160)).astype(np.float32)
    # Tiles of zeros beside ordinary tiles, and a lone nonzero among zeros.
    zeros = np.zeros((33, 70), np.float32)
    zeros[:, 40:] = rng.standard_normal((33, 30)).astype(np.float32)
    zeros[5, 3] = np.float32(1e-3)
    # float32 subnormals and values that land on E4M3 subnormals after scaling (a block whose
    # amax is 448 leaves its small values below 2^-6).
    special = rng.standard_normal((8, 64)).astype(np.float32)
    special[0, :32] = np.float32(1e-40) * np.arange(1, 33, dtype=np.float32)
    special[1, :] = np.float32(2.0) ** -rng.integers(4, 14, size=64).astype(np.float32)
    special[1, 0] = special[1, 32] = E4M3_MAX
    special[2, :] = E4M3_MAX * np.float32(1.0 + 1.0 / 64)  # beyond the E4M3 maximum
    special[2, 5] = np.float32(3.0e38)
    special[3, 7] = np.float32(np.inf)
    special[3, 40] = np.float32(-np.inf)
    special[4, 9] = np.float32(np.nan)
    special[5, :32] = np.float32(np.nan)
    special[6, :] = np.float32(464.0)  # exactly between 448 and the missing 480
    special[7, :] = np.float32(2.0) ** -130  # a whole block of tiny subnormals
    return {"random": random, "zeros": zeros, "special": special}


def scalar_cases() -> dict[str, np.ndarray]:
    e4m3 = [0.0, -0.0, 1.0, -1.0, 448.0, -448.0, 449.0, 463.9, 464.0, 480.0, 1e6, np.inf, -np.inf,
            np.nan, 2.0**-6, 2.0**-7, 2.0**-9, 2.0**-10, 1.5 * 2.0**-10, 3 * 2.0**-10,
            2.0**-6 * (1 + 1 / 16), 2.0**-6 * (1 + 3 / 16), 1.0625, 1.1875, 240.0, 1e-40, 0.3]
    e8m0 = [0.0, 1.0, 1.5, 2.0, 0.75, 2.0**-127, 2.0**-127 * 1.5, 2.0**-128, 2.0**-149, 2.0**127,
            3.0e38, np.inf, np.nan, 1e-3, 448.0 / 448.0]
    bf16 = [0.0, -0.0, 1.0, 1.00390625, 1.005859375, 1.01171875, 3.0e38, 3.4e38, np.inf, -np.inf,
            np.nan, -np.nan, 1e-40, 1e-45, -2.5e-39, 0.1, -123.456]
    return {"e4m3": np.array(e4m3, np.float32), "e8m0": np.array(e8m0, np.float32),
            "bf16": np.array(bf16, np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/data/quantize_reference.bin")
    args = parser.parse_args()

    records: list[tuple[str, np.ndarray]] = []
    scalars = scalar_cases()
    records.append(("e4m3.input", scalars["e4m3"]))
    records.append(("e4m3.codes", e4m3_codes(scalars["e4m3"])))
    records.append(("e8m0.input", scalars["e8m0"]))
    records.append(("e8m0.codes",
                    np.array([e8m0_round_up(np.float32(v)) for v in scalars["e8m0"]], np.int32)))
    records.append(("bf16.input", scalars["bf16"]))
    records.append(("bf16.bits",
                    scalars["bf16"].astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int32)))

    recipes = {"mxfp8_1x32": (1, 32, "mxfp8"), "mxfp8_32x1": (32, 1, "mxfp8"),
               "fp8_1x128": (1, 128, "deepseek"), "fp8_128x1": (128, 1, "deepseek"),
               "fp8_128x128": (128, 128, "deepseek")}
    for case, x in matrices(np.random.default_rng(SEED)).items():
        records.append((f"{case}.x", x))
        for recipe, (block_rows, block_cols, rule) in recipes.items():
            codes, scales, dequantized = quantize(x, block_rows, block_cols, rule)
            records.append((f"{case}.{recipe}.elements", codes))
            records.append((f"{case}.{recipe}.scales", scales))
            records.append((f"{case}.{recipe}.dequantized", dequantized))

    out = pathlib.Path(args.out)
    write_reference(out, records)
    print(f"{out}: {len(records)} tensors, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
