"""The bytes of one cached sample in Redis: a small header and the raw array, never a pickle.

Layout (little endian): magic ``DCv1`` (4 bytes), dtype code (1), ndim (1), shape (ndim x uint32),
sample index (uint64), CRC32 of the payload (uint32), then the C-order payload. A reader knows the
dtype and shape it expects, so everything but the index and the CRC is compared as one byte string;
a value that fails any check (other magic, dtype, shape, index, length or CRC) is a miss.
The CRC32 is zlib-ng's (SIMD, 4x zlib's speed, the same checksum; zlib's without zlib-ng).
"""
import struct

import numpy as np

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:   # same checksum, 3-4x slower
    from zlib import crc32

MAGIC = b"DCv1"
DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
          "float16", "float32", "float64")
_TAIL = struct.Struct("<QI")   # index, crc32


def dtype_code(dtype):
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise ValueError(f"preprocess returns dtype {name}; the cache stores {', '.join(DTYPES)}")
    return DTYPES.index(name)


class Codec:
    """Encodes and checks the values of one dataset (one dtype and shape)."""

    def __init__(self, dtype, shape):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.prefix = (MAGIC + bytes([dtype_code(self.dtype), len(self.shape)])
                       + struct.pack(f"<{len(self.shape)}I", *self.shape))
        self.header = len(self.prefix) + _TAIL.size
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.size = self.header + self.nbytes

    def encode(self, index, array):
        array = np.asarray(array, dtype=self.dtype, order="C")   # keeps a 0-d array 0-d
        if array.shape != self.shape:
            raise ValueError(f"shape {array.shape} != {self.shape}")
        payload = memoryview(array).cast("B")
        return b"".join((self.prefix, _TAIL.pack(int(index), crc32(payload)), payload))

    def decode_into(self, value, index, out):
        """Writes the sample into ``out`` and returns True when ``value`` is valid for ``index``."""
        if value is None or len(value) != self.size or not value.startswith(self.prefix):
            return False
        got_index, crc = _TAIL.unpack_from(value, len(self.prefix))
        payload = memoryview(value)[self.header:]
        if got_index != index or crc32(payload) != crc:
            return False
        out[...] = np.frombuffer(payload, self.dtype).reshape(self.shape)
        return True

    def decode_batch(self, values, indices, out):
        """``decode_into`` for a batch (one MGET reply), with less Python per value: writes the
        valid values into ``out`` (the rows of the others are zeroed) and returns the bool mask of
        the valid values. Copies each payload once, straight from the reply's bytes."""
        n, size, prefix, start = len(values), self.size, self.prefix, len(self.prefix)
        valid = np.zeros(n, bool)
        rows = out.reshape(n, -1).view(np.uint8)
        for j, (value, index) in enumerate(zip(values, np.asarray(indices).tolist())):
            if value is None or len(value) != size or not value.startswith(prefix):
                continue
            got_index, crc = _TAIL.unpack_from(value, start)
            payload = memoryview(value)[self.header:]
            if got_index == index and crc32(payload) == crc:
                rows[j] = payload
                valid[j] = True
        rows[~valid] = 0
        return valid
