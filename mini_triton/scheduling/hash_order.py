"""The order in which a C++ `std::unordered_map<std::string, ...>` (GCC's libstdc++, as
Triton is built) lists its keys, given the order they were inserted.

Triton's ensemble scheduler keeps the ensemble's outputs in such a map (keyed by name,
filled in config order) and writes a response's outputs in its iteration order; clients
that read outputs by position see that order, so the ensemble scheduler here reproduces
it. The model: libstdc++ hashes a string with `_Hash_bytes` (64-bit MurmurHash2, seed
0xc70f6907), keeps one singly linked list of nodes, puts a node into an empty bucket at
the front of that list and into a used bucket at the front of the bucket's run, and on a
rehash (the prime rehash policy, max load factor 1) re-inserts the nodes in list order by
the same rule. Bucket counts 13, 29, 59, 127, ...: libstdc++'s prime table, which holds
every prime up to 97; past that the next prime is taken, close to but not always its table.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_SEED = 0xC70F6907
# libstdc++'s _Prime_rehash_policy: small sizes read this table, larger ones the next prime.
_FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def string_hash(key: str) -> int:
    """`std::hash<std::string>` of libstdc++ on a 64-bit machine."""
    data = key.encode()
    length = len(data)
    value = _SEED ^ ((length * _MUL) & _MASK)
    aligned = length & ~7
    for start in range(0, aligned, 8):
        word = int.from_bytes(data[start:start + 8], "little")
        word = (_shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK
        value = ((value ^ word) * _MUL) & _MASK
    if length & 7:
        value = ((value ^ int.from_bytes(data[aligned:], "little")) * _MUL) & _MASK
    value = (_shift_mix(value) * _MUL) & _MASK
    return _shift_mix(value)


def _is_prime(number: int) -> bool:
    return number >= 2 and all(number % d for d in range(2, int(number ** 0.5) + 1))


def _next_bucket_count(wanted: int) -> int:
    if wanted < len(_FAST_BUCKETS):
        return _FAST_BUCKETS[wanted]
    while not _is_prime(wanted):
        wanted += 1
    return wanted


def _place(order: list[str], key: str, bucket_of) -> None:
    """Insert `key` at the front of its bucket's run, or at the front of the list."""
    bucket = bucket_of(key)
    for index, other in enumerate(order):
        if bucket_of(other) == bucket:
            order.insert(index, key)
            return
    order.insert(0, key)


def iteration_order(keys: list[str]) -> list[str]:
    """The keys (distinct, in insertion order) in the order the map iterates them."""
    hashes = {key: string_hash(key) for key in keys}
    buckets, next_resize, order = 1, 0, []
    for count, key in enumerate(keys):
        if count + 1 > next_resize:  # _M_need_rehash, max load factor 1
            # The first insertion asks for at least 11 buckets.
            wanted = max(count + 1, 11 if next_resize == 0 else 0)
            if wanted >= buckets:
                buckets = _next_bucket_count(max(wanted + 1, buckets * 2))
                rehashed: list[str] = []
                for old in order:
                    _place(rehashed, old, lambda k: hashes[k] % buckets)
                order = rehashed
            next_resize = buckets
        _place(order, key, lambda k: hashes[k] % buckets)
    return order
