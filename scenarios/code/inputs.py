"""Generators of valid inputs for code/debug-v3's hidden tests, one per function.

``INPUTS[name](rng)`` draws the positional arguments of one call of the function ``name``
(a tuple of plain values whose ``repr`` is a Python literal). code/debug-v3 draws its hidden
calls from these afresh in every episode and takes the expected values from the reference
fix, run in the scenario's own process (:mod:`parley.scenarios.code.task_set`).

What each generator must do, and ``tests/scenarios/code/test_debug_v3.py`` checks:

- stay in the function's documented domain (the reference fix never raises on a draw);
- reach the task's bug often: each bug of the task set shows on at least a fifth of the
  draws, so the unfixed code passes all of an episode's hidden calls with probability
  below 0.8^32, about 0.001;
- spread its draws: no output value and no input is frequent enough that a constant, or a
  table of a few dozen inputs on top of the unfixed code, passes all the calls of an episode
  (the attack suite measures each family's expected reward);
- keep each result small (its encoding under the harness's 1,500 characters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

import numpy as np

__all__ = ["INPUTS", "Draw"]

Draw = Callable[[np.random.Generator], tuple[Any, ...]]
T = TypeVar("T")

_LOWER = "abcdefghijklmnopqrstuvwxyz"
_ROMAN = (
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
)  # fmt: skip


def _int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """A uniform integer in ``[lo, hi]`` (a Python ``int``: its ``repr`` is a literal)."""
    return int(rng.integers(lo, hi + 1))


def _pick(rng: np.random.Generator, items: Sequence[T]) -> T:
    return items[int(rng.integers(len(items)))]


def _ints(rng: np.random.Generator, lo: int, hi: int, min_len: int, max_len: int) -> list[int]:
    return [_int(rng, lo, hi) for _ in range(_int(rng, min_len, max_len))]


def _word(rng: np.random.Generator, letters: str, lo: int, hi: int) -> str:
    return "".join(_pick(rng, letters) for _ in range(_int(rng, lo, hi)))


def _mixed_case(rng: np.random.Generator, text: str) -> str:
    return "".join(c.upper() if rng.random() < 0.4 else c for c in text)


@cache
def _primes() -> tuple[int, ...]:
    """The primes below 1,000 (squares of these reach is_prime's bug)."""
    sieve = bytearray([1]) * 1000
    sieve[:2] = b"\0\0"
    for p in range(2, 32):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(sieve[p * p :: p]))
    return tuple(i for i, flag in enumerate(sieve) if flag)


def _palindrome(rng: np.random.Generator) -> tuple[Any, ...]:
    half = _word(rng, "abcd", 0, 5)
    text = half + _word(rng, "abcd", 0, 1) + half[::-1] if rng.random() < 0.7 else half
    return (_mixed_case(rng, text),)


def _is_prime(rng: np.random.Generator) -> tuple[Any, ...]:
    roll = rng.random()
    if roll < 0.35:
        return (_pick(rng, _primes()) ** 2,)
    if roll < 0.6:
        return (_pick(rng, _primes()),)
    return (_int(rng, -5, 10**6),)


def _binary_search(rng: np.random.Generator) -> tuple[Any, ...]:
    xs = sorted(set(_ints(rng, 0, 60, 0, 12)))
    target = _pick(rng, xs) if xs and rng.random() < 0.7 else _int(rng, -5, 65)
    return (xs, target)


def _spaced_words(rng: np.random.Generator) -> tuple[Any, ...]:
    words = [_word(rng, "abcxyz", 1, 4) for _ in range(_int(rng, 0, 4))]
    gaps = [" " * _int(rng, 1, 3) for _ in words]
    text = "".join(g + w for g, w in zip(gaps, words, strict=True))
    return (text if rng.random() < 0.5 else text.strip(),)


def _nested(rng: np.random.Generator, depth: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(_int(rng, 0, 3)):
        deeper = depth < 3 and rng.random() < 0.45
        out.append(_nested(rng, depth + 1) if deeper else _int(rng, 0, 9))
    return out


def _sorted_pair(rng: np.random.Generator) -> tuple[Any, ...]:
    return (sorted(_ints(rng, 0, 30, 0, 6)), sorted(_ints(rng, 0, 30, 0, 6)))


def _words_text(rng: np.random.Generator) -> tuple[Any, ...]:
    vocab = ["the", "cat", "a", "dog", "sat", "on", "mat"]
    return (" ".join(_mixed_case(rng, _pick(rng, vocab)) for _ in range(_int(rng, 0, 6))),)


def _clamp(rng: np.random.Generator) -> tuple[Any, ...]:
    lo = _int(rng, -60, 60)
    return (_int(rng, -100, 100), lo, lo + _int(rng, 0, 40))


def _brackets(rng: np.random.Generator) -> tuple[Any, ...]:
    pairs = ["()", "[]", "{}"]
    text = ""
    for _ in range(_int(rng, 0, 4)):
        pair = _pick(rng, pairs)
        text = pair[0] + text + pair[1] if rng.random() < 0.5 else text + pair
    roll = rng.random()
    if roll < 0.35:  # an opener left unclosed (the unfixed code calls this balanced)
        at = _int(rng, 0, len(text))
        text = text[:at] + _pick(rng, "([{") + text[at:]
    elif roll < 0.55:
        text = _word(rng, "()[]{}x", 0, 8)
    return (text,)


def _roman(rng: np.random.Generator) -> tuple[Any, ...]:
    n, out = _int(rng, 1, 3999), ""
    for value, numeral in _ROMAN:
        while n >= value:
            out, n = out + numeral, n - value
    return (out,)


def _leap_year(rng: np.random.Generator) -> tuple[Any, ...]:
    roll = rng.random()
    if roll < 0.3:
        return (400 * _int(rng, 1, 10**6),)
    if roll < 0.5:
        return (100 * _int(rng, 1, 4 * 10**6),)
    return (_int(rng, 1, 4 * 10**8),)


def _matrix(rng: np.random.Generator) -> tuple[Any, ...]:
    if rng.random() < 0.05:
        return ([],)
    cols = _int(rng, 1, 4)
    return ([_ints(rng, 0, 9, cols, cols) for _ in range(_int(rng, 1, 4))],)


def _anagram(rng: np.random.Generator) -> tuple[Any, ...]:
    a = _word(rng, "abcde", 0, 6)
    roll = rng.random()
    if roll < 0.4:
        b = "".join(rng.permutation(list(a))) if a else ""
    elif roll < 0.75 and a:  # the same letters, other counts (the unfixed code says yes)
        b = a + _pick(rng, a)
        b = "".join(rng.permutation(list(b)))
    else:
        b = _word(rng, "abcde", 0, 6)
    return (a, str(b))


def _runs(rng: np.random.Generator) -> tuple[Any, ...]:
    return ("".join(_pick(rng, "abc") * _int(rng, 1, 4) for _ in range(_int(rng, 0, 5))),)


INPUTS: dict[str, Draw] = {
    # the bundled tasks (debug_tasks.json), by function name
    "digit_sum": lambda rng: (int(10 ** rng.uniform(0, 12)) - 1,),
    "is_palindrome": _palindrome,
    "fizzbuzz": lambda rng: (_int(rng, 0, 60),),
    "factorial": lambda rng: (_int(rng, 0, 300),),
    "fib": lambda rng: (_int(rng, 0, 500),),
    "max_subarray": lambda rng: (_ints(rng, -30, -1 if rng.random() < 0.4 else 30, 1, 10),),
    "binary_search": _binary_search,
    "reverse_words": _spaced_words,
    "count_vowels": lambda rng: (_mixed_case(rng, _word(rng, _LOWER, 0, 15)),),
    "c_to_f": lambda rng: (_int(rng, -1000, 1000),),
    "median": lambda rng: (_ints(rng, -50, 50, 1, 9),),
    "flatten": lambda rng: (_nested(rng, 0),),
    "unique": lambda rng: (_ints(rng, 0, 6, 0, 10),),
    "chunk": lambda rng: (_ints(rng, 0, 99, 0, 12), _int(rng, 1, 5)),
    "word_count": _words_text,
    "gcd": lambda rng: (_int(rng, 0, 10**4), _int(rng, 0, 10**4)),
    "is_prime": _is_prime,
    "rotate": lambda rng: (_ints(rng, 0, 9, 0, 8), _int(rng, 0, 25)),
    "caesar": lambda rng: (_word(rng, _LOWER + "  ", 0, 12), _int(rng, 0, 60)),
    "second_largest": lambda rng: ([*_ints(rng, 0, 9, 1, 7), 10, _int(rng, 10, 11)],),
    "running_sum": lambda rng: (_ints(rng, -9, 9, 0, 10),),
    "merge_sorted": _sorted_pair,
    "title_case": lambda rng: (
        " ".join(_mixed_case(rng, _word(rng, "abcdefgh", 1, 6)) for _ in range(_int(rng, 0, 4))),
    ),
    "parse_time": lambda rng: (f"{_int(rng, 0, 23)}:{_int(rng, 0, 59):02d}",),
    "clamp": _clamp,
    "balanced": _brackets,
    "roman_to_int": _roman,
    "leap_year": _leap_year,
    "transpose": _matrix,
    "is_anagram": _anagram,
    "compress": _runs,
    "count_longer": lambda rng: (
        [_word(rng, "abc", 0, 6) for _ in range(_int(rng, 0, 8))],
        _int(rng, 0, 5),
    ),
}
"""One generator per function name (the bundled tasks', then the generator's bases)."""


def _small(rng: np.random.Generator, max_len: int = 9) -> list[int]:
    """A list of small integers (equal neighbours and boundary values are common)."""
    return _ints(rng, -4, 9, 0, max_len)


def _text(rng: np.random.Generator, letters: str = "aAbBcz ") -> str:
    return _word(rng, letters, 0, 10)


INPUTS.update(
    {  # the generator's bases (parley.scenarios.code.generate), by function name
        "sum_evens": lambda rng: (_small(rng),),
        "count_in_range": lambda rng: (_small(rng), _int(rng, -4, 5), _int(rng, 0, 9)),
        "index_of_max": lambda rng: (_ints(rng, 0, 6, 1, 8),),
        "last_index": lambda rng: (_ints(rng, 0, 4, 0, 8), _int(rng, 0, 5)),
        "triangle_kind": lambda rng: tuple(_int(rng, 1, 6) for _ in range(3)),
        "letter_grade": lambda rng: (_int(rng, 0, 100),),
        "sum_range": lambda rng: (_int(rng, -20, 20), _int(rng, -20, 30)),
        "count_runs": lambda rng: (_word(rng, "aab", 0, 10),),
        "longest_run": lambda rng: (_ints(rng, 0, 2, 0, 10),),
        "diffs": lambda rng: (_small(rng),),
        "dot": lambda rng: (_small(rng, 6), _small(rng, 6)),
        "is_sorted": lambda rng: (
            sorted(_small(rng)) if rng.random() < 0.5 else _ints(rng, 0, 3, 0, 6),
        ),
        "pairs_with_sum": lambda rng: (_ints(rng, 0, 6, 0, 8), _int(rng, 0, 10)),
        "insertion_sort": lambda rng: (_small(rng, 8),),
        "insert_sorted": lambda rng: (sorted(_small(rng, 7)), _int(rng, -5, 10)),
        "triangular": lambda rng: (_int(rng, -3, 2000),),
        "to_binary": lambda rng: (_int(rng, 0, 10**6),),
        "from_binary": lambda rng: (_word(rng, "01", 0, 20),),
        "count_upper": lambda rng: (_word(rng, "AZaz@[`{mM", 0, 12),),
        "mask": lambda rng: (_word(rng, "0123456789", 0, 10), _int(rng, 0, 8)),
        "max_window_sum": lambda rng: _window(rng),
        "spread": lambda rng: (_ints(rng, -9, 9, 1, 8),),
        "safe_div": lambda rng: (_int(rng, -50, 50), _int(rng, -6, 6)),
        "sign": lambda rng: (_int(rng, -(10**6), 10**6) * int(rng.random() < 0.8),),
        "ticket_price": lambda rng: (_int(rng, 0, 99),),
        "running_max": lambda rng: (_small(rng),),
        "count_multiples": lambda rng: (_int(rng, 0, 500), _int(rng, 1, 12)),
        "pad_left": lambda rng: (_word(rng, "xyz", 0, 8), _int(rng, 0, 10)),
        "trace": lambda rng: _square(rng),
        "histogram": lambda rng: (_ints(rng, 0, 5, 0, 9),),
        "max_gap": lambda rng: (_ints(rng, -20, 20, 0, 7),),
        "rotate_str": lambda rng: (_word(rng, "abcde", 0, 7), _int(rng, 0, 20)),
        "every_other": lambda rng: (_small(rng), _int(rng, 0, 4)),
        "count_peaks": lambda rng: (_ints(rng, 0, 4, 0, 10),),
        "first_repeat": lambda rng: (_ints(rng, 0, 12, 0, 8),),
        "split_evens_odds": lambda rng: (_small(rng),),
        "power": lambda rng: (_int(rng, -9, 9), _int(rng, 0, 12)),
        "count_at_least": lambda rng: (_ints(rng, 0, 5, 0, 9), _int(rng, 0, 5)),
        "strictly_increasing": lambda rng: (sorted(_ints(rng, 0, 9, 0, 6)),),
        "max_below": lambda rng: (_ints(rng, 0, 6, 0, 8), _int(rng, 0, 6)),
        "min_index": lambda rng: (_ints(rng, 0, 4, 1, 8),),
        "clip_all": lambda rng: _clip(rng),
        "prefix_within": lambda rng: (_ints(rng, 0, 4, 0, 8), _int(rng, 0, 12)),
        "keep_at_least": lambda rng: (_ints(rng, 0, 5, 0, 9), _int(rng, 0, 5)),
        "count_equal_neighbours": lambda rng: (_ints(rng, 0, 2, 0, 10),),
        "count_negatives": lambda rng: (_ints(rng, -3, 3, 0, 9),),
        "abs_sum": lambda rng: (_ints(rng, -9, 9, 0, 8),),
        "replace_all": lambda rng: (_ints(rng, 0, 4, 0, 8), _int(rng, 0, 4), _int(rng, 5, 9)),
        "interleave": lambda rng: (_ints(rng, 0, 9, 0, 5), _ints(rng, 10, 19, 0, 5)),
        "majority": lambda rng: (_ints(rng, 0, _int(rng, 1, 3), 0, 7),),
        "count_between": lambda rng: (_ints(rng, 0, 6, 0, 9), _int(rng, 0, 4), _int(rng, 2, 6)),
    }
)


def _window(rng: np.random.Generator) -> tuple[Any, ...]:
    xs = _ints(rng, -9, 9, 1, 9)
    return (xs, _int(rng, 1, len(xs)))


def _clip(rng: np.random.Generator) -> tuple[Any, ...]:
    lo = _int(rng, 0, 5)
    return (_ints(rng, 0, 9, 0, 8), lo, lo + _int(rng, 0, 4))


def _square(rng: np.random.Generator) -> tuple[Any, ...]:
    n = _int(rng, 0, 5)
    return ([_ints(rng, -9, 9, n, n) for _ in range(n)],)
