"""Writer of the MTREF reference dumps that tests/reference_file.h reads (format: README.md)."""
import pathlib
import struct

import numpy as np

MAGIC = b"MTREF\0\0\0"
VERSION = 1
DTYPE_CODES = {np.dtype("<f4"): 0, np.dtype("<i4"): 1, np.dtype("<f8"): 2}


def tensor_record(name: str, array: np.ndarray) -> bytes:
    array = np.ascontiguousarray(array)
    code = DTYPE_CODES[array.dtype]
    encoded = name.encode("utf-8")
    head = struct.pack("<I", len(encoded)) + encoded + struct.pack("<BB", code, array.ndim)
    head += struct.pack(f"<{array.ndim}q", *array.shape)
    return head + array.tobytes(order="C")


def write_reference(out: pathlib.Path, records: list[tuple[str, np.ndarray]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(records)))
        for name, array in records:
            f.write(tensor_record(name, array))
