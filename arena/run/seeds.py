"""Many :func:`~parley.arena.run.episode.derive_seed` values at once, a table of keys a call.

``derive_seed(*keys)`` is ``SeedSequence(keys).generate_state(1)[0] >> 1``.
:func:`derive_rows` computes the same numbers for a whole table of keys with numpy's integer
arithmetic: NumPy's ``SeedSequence`` algorithm (its ``mix_entropy`` and ``generate_state``,
pool size 4, 32-bit words) over every row at once.
It covers keys below ``2**32`` (each one 32-bit word of entropy, as ``SeedSequence`` splits
them); callers use ``derive_seed`` for the rest. The two agree bit for bit
(``tests/arena/run/test_seeds.py`` compares them on random keys).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["WORD", "derive_rows"]

WORD = 1 << 32
"""Keys below this are one entropy word each: :func:`derive_rows` takes them."""

_MASK = np.uint64(WORD - 1)
_SHIFT = np.uint64(16)
_POOL = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = np.uint64(0xCA01F9DD), np.uint64(0x4973F715)
_PAIRS = [(src, dst) for src in range(_POOL) for dst in range(_POOL) if src != dst]


def _hash_constants() -> Iterator[tuple[np.uint64, np.uint64]]:
    """The (xor, multiplier) pairs of ``hashmix``'s successive calls (data-independent)."""
    const = _INIT_A
    while True:
        following = (const * _MULT_A) % WORD
        yield np.uint64(const), np.uint64(following)
        const = following


def _hashmix(value: np.ndarray, consts: Iterator[tuple[np.uint64, np.uint64]]) -> np.ndarray:
    xor, mult = next(consts)
    value = ((value ^ xor) * mult) & _MASK  # both < 2**32: the product fits in 64 bits
    return value ^ (value >> _SHIFT)


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result: np.ndarray = np.bitwise_and(_MIX_L * x - _MIX_R * y, _MASK)  # mod 2**64, then 2**32
    return result ^ (result >> _SHIFT)  # type: ignore[no-any-return]


# Why a table at once: derive_seed costs ~25 µs a call and an episode of two seats needs
# three, so planning a run of a million episodes took over a minute before its first
# episode; one numpy pass over the rows replaces those calls.
def derive_rows(keys: np.ndarray) -> np.ndarray:
    """``derive_seed(*row)`` for every row of ``keys`` (shape ``(n, k)``, ``k >= 1``, every
    key in ``[0, 2**32)``), as an int64 array of ``n`` seeds."""
    words = np.asarray(keys, dtype=np.uint64)
    if words.ndim != 2 or words.shape[1] < 1:
        raise ValueError(f"keys must be a table of shape (n, k >= 1), got {words.shape}")
    if words.size and int(words.max()) >= WORD:
        raise ValueError("derive_rows takes keys below 2**32; use derive_seed for the rest")
    n, k = words.shape
    consts = _hash_constants()
    zero = np.zeros(n, dtype=np.uint64)
    pool = [_hashmix(words[:, i] if i < k else zero, consts) for i in range(_POOL)]
    for src, dst in _PAIRS:
        pool[dst] = _mix(pool[dst], _hashmix(pool[src], consts))
    for i in range(_POOL, k):
        for dst in range(_POOL):
            pool[dst] = _mix(pool[dst], _hashmix(words[:, i], consts))
    # generate_state(1): the first pool word, hashed with INIT_B.
    state = ((pool[0] ^ np.uint64(_INIT_B)) * np.uint64(_INIT_B * _MULT_B % WORD)) & _MASK
    state ^= state >> _SHIFT
    return (state >> np.uint64(1)).astype(np.int64)
