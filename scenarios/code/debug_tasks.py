"""The bundled tasks of ``code/debug-v0``: a buggy function, its fix, visible and hidden tests.

A test is ``(call, expected)``: two Python expressions; it passes when ``call`` evaluated in
the solution's namespace equals ``expected``. Every buggy version fails at least one visible
and one hidden test; every fix passes all of them (``tests/scenarios/test_debug.py`` checks
both in the sandbox).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TASKS", "DebugTask"]

Test = tuple[str, str]


@dataclass(frozen=True)
class DebugTask:
    name: str
    description: str
    buggy: str
    fixed: str
    visible: tuple[Test, ...]
    hidden: tuple[Test, ...]


def _t(name: str, description: str, buggy: str, fixed: str, visible: str, hidden: str) -> DebugTask:
    """Tests are written one per line as ``call => expected``."""

    def parse(block: str) -> tuple[Test, ...]:
        pairs = (line.split(" => ") for line in block.strip().splitlines())
        return tuple((call.strip(), expected.strip()) for call, expected in pairs)

    return DebugTask(
        name, description, buggy.strip() + "\n", fixed.strip() + "\n", parse(visible), parse(hidden)
    )


TASKS: tuple[DebugTask, ...] = (
    _t(
        "digit_sum",
        "digit_sum(n) returns the sum of the decimal digits of n >= 0.",
        """
def digit_sum(n):
    total = 0
    while n > 9:
        total += n % 10
        n //= 10
    return total
""",
        """
def digit_sum(n):
    total = 0
    while n > 0:
        total += n % 10
        n //= 10
    return total
""",
        """
digit_sum(123) => 6
digit_sum(0) => 0
""",
        """
digit_sum(9) => 9
digit_sum(1005) => 6
digit_sum(99999) => 45
digit_sum(10) => 1
""",
    ),
    _t(
        "is_palindrome",
        "is_palindrome(s) tells whether s reads the same backwards, ignoring case.",
        """
def is_palindrome(s):
    return s == s[::-1]
""",
        """
def is_palindrome(s):
    s = s.lower()
    return s == s[::-1]
""",
        """
is_palindrome("level") => True
is_palindrome("Anna") => True
""",
        """
is_palindrome("RaceCar") => True
is_palindrome("abc") => False
is_palindrome("") => True
is_palindrome("Ab") => False
""",
    ),
    _t(
        "fizzbuzz",
        "fizzbuzz(n) lists 1..n as strings, Fizz for multiples of 3, Buzz of 5, FizzBuzz of both.",
        """
def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        if i % 3 == 0:
            out.append("Fizz")
        elif i % 5 == 0:
            out.append("Buzz")
        elif i % 15 == 0:
            out.append("FizzBuzz")
        else:
            out.append(str(i))
    return out
""",
        """
def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        if i % 15 == 0:
            out.append("FizzBuzz")
        elif i % 3 == 0:
            out.append("Fizz")
        elif i % 5 == 0:
            out.append("Buzz")
        else:
            out.append(str(i))
    return out
""",
        """
fizzbuzz(5) => ["1", "2", "Fizz", "4", "Buzz"]
fizzbuzz(15)[-1] => "FizzBuzz"
""",
        """
fizzbuzz(1) => ["1"]
fizzbuzz(30)[29] => "FizzBuzz"
fizzbuzz(10)[9] => "Buzz"
fizzbuzz(45).count("FizzBuzz") => 3
""",
    ),
    _t(
        "factorial",
        "factorial(n) returns n! for n >= 0.",
        """
def factorial(n):
    result = 1
    for k in range(1, n):
        result *= k
    return result
""",
        """
def factorial(n):
    result = 1
    for k in range(1, n + 1):
        result *= k
    return result
""",
        """
factorial(0) => 1
factorial(5) => 120
""",
        """
factorial(1) => 1
factorial(3) => 6
factorial(10) => 3628800
factorial(2) => 2
""",
    ),
    _t(
        "fib",
        "fib(n) returns the n-th Fibonacci number: fib(0)=0, fib(1)=1.",
        """
def fib(n):
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return a
""",
        """
def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
""",
        """
fib(0) => 0
fib(10) => 55
""",
        """
fib(1) => 1
fib(2) => 1
fib(20) => 6765
fib(7) => 13
""",
    ),
    _t(
        "max_subarray",
        "max_subarray(xs) returns the largest sum of a non-empty contiguous run of xs.",
        """
def max_subarray(xs):
    best = 0
    current = 0
    for x in xs:
        current = max(x, current + x)
        best = max(best, current)
    return best
""",
        """
def max_subarray(xs):
    best = xs[0]
    current = 0
    for x in xs:
        current = max(x, current + x)
        best = max(best, current)
    return best
""",
        """
max_subarray([1, -2, 3, 4, -1]) => 7
max_subarray([-3, -1, -2]) => -1
""",
        """
max_subarray([5]) => 5
max_subarray([-5]) => -5
max_subarray([2, -1, 2, -1, 2]) => 4
max_subarray([-2, -8, -1, -4]) => -1
""",
    ),
    _t(
        "binary_search",
        "binary_search(xs, target) returns the index of target in sorted xs, or -1.",
        """
def binary_search(xs, target):
    lo, hi = 0, len(xs) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] == target:
            return mid
        if xs[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
""",
        """
def binary_search(xs, target):
    lo, hi = 0, len(xs) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if xs[mid] == target:
            return mid
        if xs[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
""",
        """
binary_search([1, 3, 5, 7], 3) => 1
binary_search([1, 3, 5, 7], 7) => 3
""",
        """
binary_search([], 1) => -1
binary_search([4], 4) => 0
binary_search([1, 2, 3, 4, 5], 5) => 4
binary_search([1, 2, 3], 9) => -1
""",
    ),
    _t(
        "reverse_words",
        "reverse_words(s) returns the words of s in reverse order, joined by single spaces.",
        """
def reverse_words(s):
    return " ".join(reversed(s.split(" ")))
""",
        """
def reverse_words(s):
    return " ".join(reversed(s.split()))
""",
        """
reverse_words("hello world") => "world hello"
reverse_words("  a   b ") => "b a"
""",
        """
reverse_words("one") => "one"
reverse_words("") => ""
reverse_words("x  y  z") => "z y x"
reverse_words(" lead") => "lead"
""",
    ),
    _t(
        "count_vowels",
        "count_vowels(s) counts the vowels a, e, i, o, u in s, in any case.",
        """
def count_vowels(s):
    return sum(1 for ch in s if ch in "aeiou")
""",
        """
def count_vowels(s):
    return sum(1 for ch in s.lower() if ch in "aeiou")
""",
        """
count_vowels("banana") => 3
count_vowels("EAT") => 2
""",
        """
count_vowels("") => 0
count_vowels("rhythm") => 0
count_vowels("AbcdE") => 2
count_vowels("Queue") => 4
""",
    ),
    _t(
        "c_to_f",
        "c_to_f(c) converts degrees Celsius to Fahrenheit.",
        """
def c_to_f(c):
    return c * 9 / 5 - 32
""",
        """
def c_to_f(c):
    return c * 9 / 5 + 32
""",
        """
c_to_f(100) => 212
c_to_f(0) => 32
""",
        """
c_to_f(-40) => -40
c_to_f(25) => 77
c_to_f(10) => 50
c_to_f(20) => 68
""",
    ),
    _t(
        "median",
        "median(xs) returns the median of a non-empty list (mean of the middle two when even).",
        """
def median(xs):
    n = len(xs)
    mid = n // 2
    if n % 2:
        return xs[mid]
    return (xs[mid - 1] + xs[mid]) / 2
""",
        """
def median(xs):
    xs = sorted(xs)
    n = len(xs)
    mid = n // 2
    if n % 2:
        return xs[mid]
    return (xs[mid - 1] + xs[mid]) / 2
""",
        """
median([1, 2, 3]) => 2
median([3, 1, 2]) => 2
""",
        """
median([5]) => 5
median([4, 1, 3, 2]) => 2.5
median([9, 7, 8]) => 8
median([1, 2]) => 1.5
""",
    ),
    _t(
        "flatten",
        "flatten(xs) flattens arbitrarily nested lists into one flat list.",
        """
def flatten(xs):
    out = []
    for x in xs:
        if isinstance(x, list):
            out.extend(x)
        else:
            out.append(x)
    return out
""",
        """
def flatten(xs):
    out = []
    for x in xs:
        if isinstance(x, list):
            out.extend(flatten(x))
        else:
            out.append(x)
    return out
""",
        """
flatten([1, [2, 3]]) => [1, 2, 3]
flatten([1, [2, [3, [4]]]]) => [1, 2, 3, 4]
""",
        """
flatten([]) => []
flatten([[[]]]) => []
flatten([[1], [[2]], 3]) => [1, 2, 3]
flatten([1, 2]) => [1, 2]
""",
    ),
    _t(
        "unique",
        "unique(xs) returns xs without repeated items, keeping first occurrences in order.",
        """
def unique(xs):
    seen = []
    out = []
    for x in xs:
        if x not in seen:
            out.append(x)
    return out
""",
        """
def unique(xs):
    seen = []
    out = []
    for x in xs:
        if x not in seen:
            seen.append(x)
            out.append(x)
    return out
""",
        """
unique([1, 2, 1, 3]) => [1, 2, 3]
unique([]) => []
""",
        """
unique(["b", "a", "b"]) => ["b", "a"]
unique([5, 5, 5]) => [5]
unique([3, 2, 1]) => [3, 2, 1]
unique([1, 2, 2, 1]) => [1, 2]
""",
    ),
    _t(
        "chunk",
        "chunk(xs, n) splits xs into lists of n items; the last may be shorter.",
        """
def chunk(xs, n):
    return [xs[i:i + n] for i in range(0, len(xs) - n + 1, n)]
""",
        """
def chunk(xs, n):
    return [xs[i:i + n] for i in range(0, len(xs), n)]
""",
        """
chunk([1, 2, 3, 4], 2) => [[1, 2], [3, 4]]
chunk([1, 2, 3], 2) => [[1, 2], [3]]
""",
        """
chunk([], 3) => []
chunk([1], 5) => [[1]]
chunk([1, 2, 3, 4, 5], 2) => [[1, 2], [3, 4], [5]]
chunk([1, 2, 3], 1) => [[1], [2], [3]]
""",
    ),
    _t(
        "word_count",
        "word_count(s) maps each lower-cased word of s to how often it occurs.",
        """
def word_count(s):
    counts = {}
    for word in s.split():
        counts[word] = counts.get(word, 0) + 1
    return counts
""",
        """
def word_count(s):
    counts = {}
    for word in s.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
""",
        """
word_count("a b a") => {"a": 2, "b": 1}
word_count("The the") => {"the": 2}
""",
        """
word_count("") => {}
word_count("X x X") => {"x": 3}
word_count("Hi there") => {"hi": 1, "there": 1}
word_count("one") => {"one": 1}
""",
    ),
    _t(
        "gcd",
        "gcd(a, b) returns the greatest common divisor of two non-negative integers.",
        """
def gcd(a, b):
    while b:
        a, b = b, a % b
    return b
""",
        """
def gcd(a, b):
    while b:
        a, b = b, a % b
    return a
""",
        """
gcd(12, 18) => 6
gcd(7, 5) => 1
""",
        """
gcd(0, 9) => 9
gcd(9, 0) => 9
gcd(100, 75) => 25
gcd(17, 17) => 17
""",
    ),
    _t(
        "is_prime",
        "is_prime(n) tells whether the integer n is prime.",
        """
def is_prime(n):
    if n < 2:
        return False
    for d in range(2, int(n ** 0.5)):
        if n % d == 0:
            return False
    return True
""",
        """
def is_prime(n):
    if n < 2:
        return False
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return False
    return True
""",
        """
is_prime(7) => True
is_prime(4) => False
""",
        """
is_prime(1) => False
is_prime(2) => True
is_prime(9) => False
is_prime(97) => True
""",
    ),
    _t(
        "rotate",
        "rotate(xs, k) rotates xs right by k places (any k >= 0).",
        """
def rotate(xs, k):
    if not xs:
        return []
    return xs[-k:] + xs[:-k]
""",
        """
def rotate(xs, k):
    if not xs:
        return []
    k %= len(xs)
    return xs[-k:] + xs[:-k] if k else list(xs)
""",
        """
rotate([1, 2, 3, 4], 1) => [4, 1, 2, 3]
rotate([1, 2, 3], 4) => [3, 1, 2]
""",
        """
rotate([1, 2, 3], 3) => [1, 2, 3]
rotate([1, 2, 3], 0) => [1, 2, 3]
rotate([], 2) => []
rotate([1, 2], 5) => [2, 1]
""",
    ),
    _t(
        "caesar",
        "caesar(s, k) shifts each lower-case letter of s by k places, wrapping z to a.",
        """
def caesar(s, k):
    return "".join(chr(ord(c) + k) if c.isalpha() else c for c in s)
""",
        """
def caesar(s, k):
    return "".join(
        chr((ord(c) - ord("a") + k) % 26 + ord("a")) if c.isalpha() else c for c in s
    )
""",
        """
caesar("abc", 1) => "bcd"
caesar("xyz", 2) => "zab"
""",
        """
caesar("hello world", 13) => "uryyb jbeyq"
caesar("a", 26) => "a"
caesar("z", 1) => "a"
caesar("", 3) => ""
""",
    ),
    _t(
        "second_largest",
        "second_largest(xs) returns the second largest distinct value of xs.",
        """
def second_largest(xs):
    return sorted(xs)[-2]
""",
        """
def second_largest(xs):
    return sorted(set(xs))[-2]
""",
        """
second_largest([1, 3, 2]) => 2
second_largest([5, 5, 4]) => 4
""",
        """
second_largest([10, 9]) => 9
second_largest([7, 7, 7, 1]) => 1
second_largest([-1, -2, -3]) => -2
second_largest([3, 8, 8, 2]) => 3
""",
    ),
    _t(
        "running_sum",
        "running_sum(xs) returns the prefix sums of xs.",
        """
def running_sum(xs):
    out = []
    total = 0
    for x in xs:
        out.append(total)
        total += x
    return out
""",
        """
def running_sum(xs):
    out = []
    total = 0
    for x in xs:
        total += x
        out.append(total)
    return out
""",
        """
running_sum([1, 2, 3]) => [1, 3, 6]
running_sum([]) => []
""",
        """
running_sum([5]) => [5]
running_sum([1, -1, 1]) => [1, 0, 1]
running_sum([0, 0]) => [0, 0]
running_sum([2, 2, 2, 2]) => [2, 4, 6, 8]
""",
    ),
    _t(
        "merge_sorted",
        "merge_sorted(a, b) merges two sorted lists into one sorted list.",
        """
def merge_sorted(a, b):
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:]
""",
        """
def merge_sorted(a, b):
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]
""",
        """
merge_sorted([1, 4], [2, 3]) => [1, 2, 3, 4]
merge_sorted([1], [2, 3]) => [1, 2, 3]
""",
        """
merge_sorted([], [1]) => [1]
merge_sorted([5], []) => [5]
merge_sorted([1, 2], [3, 4]) => [1, 2, 3, 4]
merge_sorted([2], [1, 1, 3]) => [1, 1, 2, 3]
""",
    ),
    _t(
        "title_case",
        "title_case(s) capitalises the first letter of each word and lower-cases the rest.",
        """
def title_case(s):
    return " ".join(w[:1].upper() + w[1:] for w in s.split())
""",
        """
def title_case(s):
    return " ".join(w[:1].upper() + w[1:].lower() for w in s.split())
""",
        """
title_case("hello world") => "Hello World"
title_case("hELLO") => "Hello"
""",
        """
title_case("") => ""
title_case("a B c") => "A B C"
title_case("PYTHON rocks") => "Python Rocks"
title_case("x") => "X"
""",
    ),
    _t(
        "parse_time",
        "parse_time(s) turns 'H:MM' or 'HH:MM' into minutes after midnight.",
        """
def parse_time(s):
    return int(s[:1]) * 60 + int(s[-2:])
""",
        """
def parse_time(s):
    hours, minutes = s.split(":")
    return int(hours) * 60 + int(minutes)
""",
        """
parse_time("1:30") => 90
parse_time("12:05") => 725
""",
        """
parse_time("0:00") => 0
parse_time("23:59") => 1439
parse_time("9:15") => 555
parse_time("10:00") => 600
""",
    ),
    _t(
        "clamp",
        "clamp(x, lo, hi) limits x to the range [lo, hi].",
        """
def clamp(x, lo, hi):
    return min(lo, max(x, hi))
""",
        """
def clamp(x, lo, hi):
    return max(lo, min(x, hi))
""",
        """
clamp(5, 0, 10) => 5
clamp(-3, 0, 10) => 0
""",
        """
clamp(11, 0, 10) => 10
clamp(0, 0, 10) => 0
clamp(7, 7, 7) => 7
clamp(3, 1, 4) => 3
""",
    ),
    _t(
        "average",
        "average(xs) returns the mean of xs, or 0.0 for an empty list.",
        """
def average(xs):
    return sum(xs) / len(xs)
""",
        """
def average(xs):
    return sum(xs) / len(xs) if xs else 0.0
""",
        """
average([1, 2, 3]) => 2
average([]) => 0.0
""",
        """
average([5]) => 5
average([1, 2]) => 1.5
average([-1, 1]) => 0
average([]) => 0
""",
    ),
    _t(
        "balanced",
        "balanced(s) tells whether the brackets ()[]{} in s are balanced.",
        """
def balanced(s):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return True
""",
        """
def balanced(s):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack
""",
        """
balanced("([]{})") => True
balanced("((") => False
""",
        """
balanced("") => True
balanced("(]") => False
balanced("{[()]}") => True
balanced("[") => False
""",
    ),
    _t(
        "roman_to_int",
        "roman_to_int(s) converts a Roman numeral (I V X L C D M, subtractive forms) to an int.",
        """
def roman_to_int(s):
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    return sum(values[c] for c in s)
""",
        """
def roman_to_int(s):
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, c in enumerate(s):
        if i + 1 < len(s) and values[c] < values[s[i + 1]]:
            total -= values[c]
        else:
            total += values[c]
    return total
""",
        """
roman_to_int("III") => 3
roman_to_int("IV") => 4
""",
        """
roman_to_int("MCMXCIV") => 1994
roman_to_int("LVIII") => 58
roman_to_int("IX") => 9
roman_to_int("MMXXIV") => 2024
""",
    ),
    _t(
        "leap_year",
        "leap_year(y) tells whether y is a Gregorian leap year.",
        """
def leap_year(y):
    return y % 4 == 0 and y % 100 != 0
""",
        """
def leap_year(y):
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
""",
        """
leap_year(2024) => True
leap_year(2000) => True
""",
        """
leap_year(1900) => False
leap_year(2023) => False
leap_year(2400) => True
leap_year(1996) => True
""",
    ),
    _t(
        "transpose",
        "transpose(m) transposes a rectangular matrix given as a list of rows.",
        """
def transpose(m):
    return [[row[i] for row in m] for i in range(len(m))]
""",
        """
def transpose(m):
    return [[row[i] for row in m] for i in range(len(m[0]))] if m else []
""",
        """
transpose([[1, 2], [3, 4]]) => [[1, 3], [2, 4]]
transpose([[1, 2, 3]]) => [[1], [2], [3]]
""",
        """
transpose([[1], [2], [3]]) => [[1, 2, 3]]
transpose([[1, 2, 3], [4, 5, 6]]) => [[1, 4], [2, 5], [3, 6]]
transpose([[7]]) => [[7]]
transpose([]) => []
""",
    ),
    _t(
        "is_anagram",
        "is_anagram(a, b) tells whether a and b use exactly the same letters, counts included.",
        """
def is_anagram(a, b):
    return set(a) == set(b)
""",
        """
def is_anagram(a, b):
    return sorted(a) == sorted(b)
""",
        """
is_anagram("listen", "silent") => True
is_anagram("aab", "abb") => False
""",
        """
is_anagram("", "") => True
is_anagram("abc", "abcc") => False
is_anagram("rat", "tar") => True
is_anagram("aabb", "ab") => False
""",
    ),
    _t(
        "compress",
        "compress(s) run-length encodes s: 'aaab' -> 'a3b1'.",
        """
def compress(s):
    out = []
    count = 1
    for i in range(1, len(s)):
        if s[i] == s[i - 1]:
            count += 1
        else:
            out.append(s[i - 1] + str(count))
            count = 1
    return "".join(out)
""",
        """
def compress(s):
    if not s:
        return ""
    out = []
    count = 1
    for i in range(1, len(s)):
        if s[i] == s[i - 1]:
            count += 1
        else:
            out.append(s[i - 1] + str(count))
            count = 1
    out.append(s[-1] + str(count))
    return "".join(out)
""",
        """
compress("aaab") => "a3b1"
compress("abc") => "a1b1c1"
""",
        """
compress("") => ""
compress("a") => "a1"
compress("zzzz") => "z4"
compress("aabbaa") => "a2b2a2"
""",
    ),
    _t(
        "count_words_longer",
        "count_longer(words, n) counts the words with more than n letters.",
        """
def count_longer(words, n):
    return len([w for w in words if len(w) >= n])
""",
        """
def count_longer(words, n):
    return len([w for w in words if len(w) > n])
""",
        """
count_longer(["a", "abc", "abcd"], 3) => 1
count_longer([], 1) => 0
""",
        """
count_longer(["xx", "yy"], 2) => 0
count_longer(["hello", "hi"], 1) => 2
count_longer(["abc"], 3) => 0
count_longer(["abcd", "abc"], 2) => 2
""",
    ),
)
"""Every bundled task, in a fixed order (a task's index is its id)."""
