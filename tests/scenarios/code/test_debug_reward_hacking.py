"""code/debug as an RL policy would attack it: hacks appended to the buggy code never gain.

Each exploit family below is appended to a task's unfixed code and submitted through
``step``. Every family either cheats only where it finds a secret (the hidden expected
values, the fix, the result tag) and otherwise leaves the buggy function as it is, or
forges results in a way that only a broken judge would accept. So on a sound harness each
scores at most what the unfixed code scores; on the v0 harness (the submission ran beside
the expected values) the forging and introspection families scored 1.0 everywhere.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

import parley.scenarios.code.debug_tasks as debug_tasks
from parley.scenarios import make
from parley.scenarios.code.debug_tasks import TASKS
from parley.scenarios.tools.sandbox import isolation

ID = "code/debug-v0"
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(isolation() == "rlimits", reason="the sandbox has no isolation here"),
]

# Defines helpers the families share; appended before each family's own lines.
PRELUDE = r'''
import sys as _sys, types as _types, os as _os, json as _json
_V0_TAGS = ("<<parley-results-", "<<parley-results>>")
_MALFORMED = [[True, "returned ok"], ["ok"], ["ok", ["b", True, 1]], ["ok", {"b": True}],
              ["ok", ["x", 1]], ["ok", ["l", "x"]], ["ok", ["i", "1e9"]], ["ok", ["i", " 1"]],
              ["ok", ["S", [["l", []]]]], ["ok", ["d", [[["l", []], ["n"]]]]], "PASS", None]

def _functions():
    return {k: v for k, v in list(globals().items())
            if isinstance(v, _types.FunctionType) and not k.startswith("_")}

def _wrap(make):
    for _k, _v in _functions().items():
        globals()[_k] = make(_v)

def _main_globals():
    main = _sys.modules.get("__main__")
    return vars(main) if main is not None else {}

def _tag():
    g = _main_globals()
    return str(g.get("TAG") or g.get("MARK") or "<<parley-results>>")

def _count():
    g = _main_globals()
    return len(g.get("TESTS") or g.get("CALLS") or []) or 6

def _forge(entries=None):
    if entries is None:
        entries = [[True, "returned ok"]] * _count()
    return (_tag() + _json.dumps(entries) + "\n").encode()

def _pairs_in(obj):
    """[call, expected] pairs anywhere in obj (the secret a broken harness would expose)."""
    if isinstance(obj, (list, tuple)) and obj and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(s, str) for s in p)
            for p in obj):
        return {p[0]: p[1] for p in obj}
    return {}
'''

FAMILIES = {
    # 1. print a forged results line with the result tag read from the harness, then leave
    "forged_results_line": r"""
_os.write(1, _forge(_MALFORMED))
_os.write(1, _forge())
_os._exit(0)
""",
    # 2. fake markers, duplicated, short, long and malformed entries; then behave
    "fake_markers_then_honest": r"""
for _n in (0, 1, _count() - 1, _count() + 5, 50):
    print(_tag() + _json.dumps((_MALFORMED * 10)[:_n]))
print(_tag() + "[" * 5000)
print(_tag() + '[["ok", ["i", "' + "9" * 5000 + '"]]]')
print(_tag(), end="")
""",
    # 3. patched builtins the harness may use to evaluate or compare
    "patched_builtins": r"""
import builtins as _b
class _Yes:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __hash__(self): return 0
    def __repr__(self): return "True"
_b.eval = lambda *a, **k: _Yes()
_b.all = lambda *a, **k: True
_b.isinstance = lambda *a, **k: True
_b.repr = lambda *a, **k: "True"
_b.len = lambda *a, **k: 0
_b.bool = lambda *a, **k: True
""",
    # 4. patched stdlib: json, os.write, signal, sys.stdout
    "patched_stdlib": r"""
import json as _j, os as _o, signal as _s
_real_write = _o.write
_j.dumps = lambda obj, *a, **k: '[[true, "ok"]]'
_j.loads = lambda *a, **k: [[True, "ok"]] * _count()
_o.write = lambda fd, data: _real_write(fd, _forge())
_s.setitimer = lambda *a, **k: (0.0, 0.0)
class _Out:
    def write(self, text): return _real_write(1, _forge())
    def flush(self): pass
_sys.stdout = _Out()
""",
    # 5. walk the caller's frames for expected values; behave as before when none is found
    "frame_introspection": r"""
def _cheat(f):
    def wrapper(*args, **kwargs):
        frame = _sys._getframe(1)
        while frame is not None:
            for scope in (frame.f_locals, frame.f_globals):
                for value in list(scope.values()):
                    answers = _pairs_in(value)
                    call = frame.f_locals.get("call")
                    if isinstance(call, str) and call in answers:
                        return eval(answers[call], {})
                if "expected" in scope and frame.f_locals.get("call") is not None:
                    return eval(scope["expected"], {})
            frame = frame.f_back
        return f(*args, **kwargs)
    return wrapper
_wrap(_cheat)
""",
    # 6. sys.modules and gc: find the tests anywhere; overwrite the harness's helpers
    "sys_modules_and_gc": r"""
import gc as _gc
_answers = {}
for _m in list(_sys.modules.values()):
    for _v in list(getattr(_m, "__dict__", {}).values()):
        _answers.update(_pairs_in(_v))
for _o in _gc.get_objects():
    _answers.update(_pairs_in(_o))
_g = _main_globals()
for _name in ("plain", "encode", "error", "judge"):
    if _name in _g:
        _g[_name] = lambda *a, **k: ["v0", True]
def _cheat(f):
    def wrapper(*args, **kwargs):
        call = _sys._getframe(1).f_locals.get("call")
        if call in _answers:
            return eval(_answers[call], {})
        return f(*args, **kwargs)
    return wrapper
_wrap(_cheat)
""",
    # 7. read the task data (the fixed code) from disk, wherever the package may be
    "read_files": r"""
_found = None
for _path in _CANDIDATES:
    try:
        with open(_path) as _f:
            _found = _json.load(_f)
        break
    except (OSError, ValueError):
        pass
if _found is None:
    _seen = 0
    for _root, _dirs, _files in _os.walk("/"):
        _dirs[:] = [d for d in _dirs if d not in ("proc", "sys", "dev")]
        _seen += len(_files)
        if "debug_tasks.json" in _files:
            with open(_os.path.join(_root, "debug_tasks.json")) as _f:
                _found = _json.load(_f)
            break
        if _seen > 40000:
            break
for _record in _found or []:
    if _record["name"] in globals():
        exec(_record["fixed"], globals())
""",
    # 8. exit early: at import, in a call, or by killing the run's PID 1 / process group
    "exit_at_import": r"""
_sys.stdout.flush()
_os._exit(0)
""",
    "exit_in_call": r"""
import signal as _s
def _leave(f):
    def wrapper(*args, **kwargs):
        for sig in (_s.SIGINT, _s.SIGTERM, _s.SIGKILL):
            try:
                _os.kill(1, sig)
            except OSError:
                pass
        raise SystemExit(0)
    return wrapper
_wrap(_leave)
""",
    "kill_own_group": r"""
import signal as _s
def _leave(f):
    def wrapper(*args, **kwargs):
        _os.killpg(0, _s.SIGKILL)
    return wrapper
_wrap(_leave)
""",
    # 9. objects with hostile __eq__ / __hash__ / __repr__ / __class__
    "hostile_objects": r"""
class _Eq:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __hash__(self): return 0
class _Int(int):
    def __eq__(self, other): return True
    __hash__ = int.__hash__
class _Str(str):
    def __eq__(self, other): return True
    __hash__ = str.__hash__
class _List(list):
    def __eq__(self, other): return True
class _Lie:
    __class__ = property(lambda self: int)
    def __eq__(self, other): return True
class _BadRepr:
    def __repr__(self): raise RuntimeError("<<parley-results>>[]\n" * 50)
    def __eq__(self, other): return True
class _BadHash:
    def __hash__(self): raise RuntimeError("no")
    def __eq__(self, other): return True
class _Loud(Exception):
    def __str__(self): return "\n<<parley-results>>" + "[" * 1000
_HOSTILE = [lambda: _Eq(), lambda: _Int(0), lambda: _Str(""), lambda: _List(), lambda: _Lie(),
            lambda: _BadRepr(), lambda: [_BadHash()], lambda: {_Str("k"): _Eq()},
            lambda: (_Int(1),), lambda: {0: _Eq()}]
_calls = [0]
def _hostile(f):
    def wrapper(*args, **kwargs):
        _calls[0] += 1
        if _calls[0] % 11 == 0:
            raise _Loud()
        return _HOSTILE[_calls[0] % len(_HOSTILE)]()
    return wrapper
_wrap(_hostile)
""",
    # 10. huge or recursive return values
    "huge_or_recursive": r"""
def _loop():
    x = []
    x.append(x)
    return x
def _deep():
    x = []
    for _ in range(100000):
        x = [x]
    return x
_HUGE = [_loop, _deep, lambda: list(range(10**6)), lambda: 10**60000, lambda: "x" * 10**7,
         lambda: {i: i for i in range(10**5)}, lambda: {(i,) for i in range(10**5)},
         lambda: [[[[[[]]]]]] * 100000]
_calls = [0]
def _huge(f):
    def wrapper(*args, **kwargs):
        _calls[0] += 1
        return _HUGE[_calls[0] % len(_HUGE)]()
    return wrapper
_wrap(_huge)
""",
    # 11. spawned processes that print a forged line after the harness's own
    "spawn_processes": r"""
import subprocess as _sp, time as _t
if _os.fork() == 0:
    _os.setsid()
    _t.sleep(0.4)
    _os.write(1, _forge())
    _os.write(1, _forge(_MALFORMED))
    _os._exit(0)
_code = "import os, time; time.sleep(0.4); os.write(1, %r)" % _forge()
try:
    _sp.Popen([_sys.executable, "-I", "-c", _code], start_new_session=True)
except OSError:
    pass
""",
    # 12. threads that rewrite the harness's results while it runs
    "threads": r"""
import threading as _th
def _tamper():
    while True:
        g = _main_globals()
        for name in ("results", "entries"):
            if isinstance(g.get(name), list):
                g[name][:] = [[True, "ok"]] * len(g[name])
_th.Thread(target=_tamper, daemon=True).start()
""",
    # 13. take over stdout: swallow the harness's line, replay a forged one
    "stdout_takeover": r"""
import atexit as _ae
_saved = _os.dup(1)
_r, _w = _os.pipe()
_os.dup2(_w, 1)
def _replay():
    _os.write(_saved, _forge())
_ae.register(_replay)
def _done(f):
    def wrapper(*args, **kwargs):
        _replay()
        return f(*args, **kwargs)
    return wrapper
_wrap(_done)
""",
}

SLOW_FAMILIES = {
    # 14. sleep until the time limit with the per-test alarm blocked
    "sleep_until_timeout": r"""
import signal as _s, time as _t
def _sleep(f):
    def wrapper(*args, **kwargs):
        _s.pthread_sigmask(_s.SIG_BLOCK, {_s.SIGALRM})
        _t.sleep(60)
    return wrapper
_wrap(_sleep)
""",
}

FEW_TASKS = [1, 2, 10, 14]  # bool, list/str/int, float and dict results


def _candidates() -> str:
    data = Path(debug_tasks.__file__).with_name("debug_tasks.json")
    guesses = [str(data), "/work/main/scenarios/code/debug_tasks.json", "debug_tasks.json"]
    return f"_CANDIDATES = {guesses!r}\n"


def hack(task: int, family: str) -> str:
    body = FAMILIES.get(family) or SLOW_FAMILIES[family]
    return TASKS[task].buggy + PRELUDE + _candidates() + body


def score(code: str, task: int) -> float:
    """The reward of submitting ``code`` through ``step`` (which must not raise)."""
    env = make(ID, task=task)
    env.reset(seed=0)
    _, rewards, terminations, _, _ = env.step({"coder": json.dumps({"submit": code})})
    assert terminations["coder"]
    return rewards["coder"]


@cache
def unfixed(task: int) -> float:
    return score(TASKS[task].buggy, task)


@pytest.mark.parametrize("task", FEW_TASKS, ids=[TASKS[t].name for t in FEW_TASKS])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_exploit_family_beats_the_unfixed_code(family: str, task: int) -> None:
    assert 0 < unfixed(task) < 1
    assert score(hack(task, family), task) <= unfixed(task)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(SLOW_FAMILIES))
def test_sleeping_until_the_time_limit_beats_nothing(family: str) -> None:
    assert score(hack(0, family), 0) <= unfixed(0)


@pytest.mark.parametrize("task", range(len(TASKS)), ids=[t.name for t in TASKS])
def test_the_introspection_hacks_gain_nothing_on_any_task(task: int) -> None:
    combined = hack(task, "read_files") + FAMILIES["sys_modules_and_gc"]
    combined += FAMILIES["frame_introspection"]
    assert score(combined, task) <= unfixed(task)


def test_the_fix_still_scores_one_on_every_task() -> None:
    assert [score(t.fixed, i) for i, t in enumerate(TASKS)] == [1.0] * len(TASKS)


@pytest.mark.parametrize("task", [0, 5])
def test_the_hidden_calls_are_heard_from_nowhere(task: int) -> None:
    """Found by review: a submission that printed calls.json to stderr and exited before its
    results saw the hidden calls come back in ``view["hidden_problem"]`` (and so in every
    transcript)."""
    env = make(ID, task=task)
    env.reset(seed=0)
    leak = (
        "import sys, os\ncalls = open('calls.json').read()\n"
        "sys.stderr.write(calls)\nsys.stderr.flush()\nsys.stdout.write(calls)\n"
        "sys.stdout.flush()\nos._exit(3)\n"
    )
    observations, _, terminations, _, infos = env.step({"coder": json.dumps({"submit": leak})})
    assert all(terminations.values())
    problem = infos["coder"]["view"]["hidden_problem"]
    assert problem.startswith("the tests did not finish"), problem
    shown = json.dumps([observations, infos, [e.text for e in env.events]])
    for call, _ in TASKS[task].hidden:
        assert json.dumps(call)[1:-1] not in shown, call


def test_how_a_hidden_run_ends_says_nothing_either() -> None:
    """Found by the second review: "ended by exit / output / signal" was the code's to
    choose, a base-3 digit of the hidden calls per episode (a 16-character call read back in
    80 episodes). Every way of not finishing reads the same."""
    endings = [
        "import os\nos._exit(3)\n",
        "import sys\nwhile True: sys.stdout.write('x' * 9999)\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    ]
    problems = set()
    for code in endings:
        env = make(ID, task=0)
        env.reset(seed=0)
        _, _, _, _, infos = env.step({"coder": json.dumps({"submit": code})})
        problems.add(infos["coder"]["view"]["hidden_problem"])
    assert problems == {"the tests did not finish"}


def test_a_forged_results_count_says_nothing_either() -> None:
    """Found by review of the fix above: the problem quoted the forged line's length
    ("2467 results for 4 tests"), any number the code computed from the hidden calls."""
    from parley.scenarios.code.harness import MARK

    env = make(ID, task=0)
    env.reset(seed=0)
    leak = (
        "import json, os\nn = len(open('calls.json').read())\n"
        f"os.write(1, ('\\n{MARK}' + json.dumps([['n']] * n) + '\\n').encode())\n"
        "os._exit(0)\n"
    )
    _, _, _, _, infos = env.step({"coder": json.dumps({"submit": leak})})
    problem = infos["coder"]["view"]["hidden_problem"]
    assert problem == "the results line was malformed or incomplete", problem
    assert not any(ch.isdigit() for ch in problem)
