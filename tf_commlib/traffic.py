"""Bytes one rank sends per aggregation of d float32 entries (4-byte values, 4-byte indices),
with ring reduce-scatter/allgather/allreduce and allgather of k entries to every peer."""
import math


def bytes_sent(algorithm, d, m, n, density):
    p = m * n
    k = max(1, math.ceil(density * d))
    shard = math.ceil(d / n)
    if algorithm == "dense":
        return 2 * (p - 1) / p * 4 * d
    if algorithm == "2dtar":
        return 2 * (n - 1) / n * 4 * d + 2 * (m - 1) / m * 4 * shard
    if algorithm == "naive_ag":
        return (p - 1) * 8 * k
    if algorithm == "hitopk":
        kt = max(1, math.ceil(density * d / n))
        return (n - 1) / n * 4 * d + (m - 1) * 8 * kt + (n - 1) * 4 * shard
    raise ValueError(f"unknown algorithm {algorithm!r}")
