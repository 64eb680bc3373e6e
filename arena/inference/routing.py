"""Which pool replica answers a request: cache-aware routing (after SGLang's router) or
least-busy.

An LLM agent re-sends its whole history every turn, and each replica's backend keeps the KV
of the sequences it served (:mod:`~parley.arena.inference.backends.prefix_cache`, vLLM's
prefix caching): a session's next turn is cheap on the replica that served its last one and
costs a full prefill anywhere else. :class:`Router` keeps an *approximate* map of what each
replica has served and sends a request where the longest part of its prompt already is,
unless that replica is overloaded.

The map: a prompt (token ids; the UTF-8 bytes of a text prompt) is cut into blocks of
``block_tokens`` and each full block is named by a hash chained over the blocks before it
(and the policy, whose weights computed the KV), so one hash names a whole prefix, as in
vLLM's block hashes. A replica *holds* a prefix of ``k`` blocks when its ``k``-th hash was
recorded for it; the match of a replica is the number of leading blocks it holds. Recorded
are each request's prompt when it is routed (so requests that share a prefix and arrive
together gather) and prompt + first completion when it is answered (what the backend keeps).

Choice (``cache_aware``), over the live replicas serving the request's policy:

1. the candidate is the session's replica when the request carries a session key that was
   routed before, else the replica with the longest match (ties: least busy);
2. no block matches anywhere: least busy (ties: the replica holding fewest blocks, so new
   sessions spread as SGLang's "smallest tree" rule spreads them);
3. the candidate is *overloaded* when its requests in flight exceed the least busy's by more
   than ``balance_abs_threshold`` **and** are more than ``balance_rel_threshold`` times
   them (SGLang's two imbalance conditions: the absolute one matters at low load, the
   relative one at high load): then least busy.

``least_busy``: the fewest requests in flight (ties: the lowest index), whatever the prompt.

The map is approximate by design: it does not see the backends' own evictions. Memory is
bounded: at most ``max_blocks`` (replica, block) entries and ``max_sessions`` session keys,
each evicted least-recently-used; a prefix's blocks are touched deepest first, so its leaf
blocks go before the blocks it shares with other sessions (a system prompt). A replica that
died or was replaced is :meth:`Router.remove`\\ d (its successor starts cold), and a weight
change :meth:`Router.clear`\\ s the map (every backend drops its caches then).

Used from one event loop (no locking).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from parley.protocols.errors import ConfigError

__all__ = ["Router", "RoutingConfig", "RoutingCounts"]

RoutingPolicy = Literal["cache_aware", "least_busy"]
ROUTING_POLICIES: tuple[str, ...] = ("cache_aware", "least_busy")


@dataclass(frozen=True)
class RoutingConfig:
    """How a front picks among its replicas (see the module docstring)."""

    policy: str = "cache_aware"
    """``cache_aware`` (prefix match and session affinity, load-capped) or ``least_busy``."""
    block_tokens: int = 16
    """Tokens per hashed block (a text prompt: 4 times as many bytes); a prompt shorter than
    one block matches nothing and is routed by load."""
    balance_abs_threshold: int = 2
    """The candidate is overloaded only when its requests in flight exceed the least busy
    replica's by more than this ..."""
    balance_rel_threshold: float = 1.5
    """... and are more than this many times the least busy's."""
    max_blocks: int = 1 << 16
    """(replica, block) entries kept, over all replicas (LRU beyond)."""
    max_sessions: int = 1 << 14
    """Session keys kept (LRU beyond)."""

    def __post_init__(self) -> None:
        if self.policy not in ROUTING_POLICIES:
            raise ConfigError(
                f"routing must be one of {', '.join(ROUTING_POLICIES)}, got {self.policy!r}"
            )
        if self.block_tokens < 1 or self.max_blocks < 1 or self.max_sessions < 1:
            raise ConfigError(
                "routing: block_tokens, max_blocks and max_sessions must be at least 1, got "
                f"{self.block_tokens}, {self.max_blocks}, {self.max_sessions}"
            )
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1:
            raise ConfigError(
                "routing: balance_abs_threshold must be 0 or more and balance_rel_threshold "
                f"1 or more, got {self.balance_abs_threshold}, {self.balance_rel_threshold}"
            )


@dataclass
class RoutingCounts:
    """How the router decided, request by request."""

    by_prefix: int = 0
    """Sent to the replica holding the longest prefix."""
    by_session: int = 0
    """Sent to the replica its session key was routed to before."""
    by_load: int = 0
    """No prefix held anywhere (or ``least_busy``): the least busy replica."""
    overloaded: int = 0
    """The candidate was overloaded: the least busy replica instead."""
    matched_blocks: int = 0
    """Blocks of the chosen replica's match, summed."""
    blocks: int = 0
    """Full blocks of the routed prompts, summed."""

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class Router:
    """Picks a replica per request and remembers what each was sent (module docstring)."""

    config: RoutingConfig = field(default_factory=RoutingConfig)
    counts: RoutingCounts = field(default_factory=RoutingCounts)
    _blocks: OrderedDict[tuple[int, int], None] = field(
        default_factory=OrderedDict, init=False, repr=False
    )  # (replica, block hash), least recent first
    _held: Counter[int] = field(default_factory=Counter, init=False, repr=False)
    _sessions: OrderedDict[str, int] = field(default_factory=OrderedDict, init=False, repr=False)

    def pick(
        self,
        policy: str,
        prompt: Sequence[int] | bytes,
        candidates: Sequence[int],
        load: Sequence[int],
        *,
        session: str = "",
    ) -> int:
        """The replica among ``candidates`` (indices into ``load``, requests in flight per
        replica; not empty) to send ``prompt`` of ``policy`` to; records the choice."""
        least = min(candidates, key=lambda i: load[i])
        if self.config.policy == "least_busy":
            self.counts.by_load += 1
            return least
        chain = self._chain(policy, prompt)
        matches = {i: self._match(i, chain) for i in candidates}
        sticky = self._sessions.get(session) if session else None
        if sticky in matches:
            choice, why = sticky, "by_session"
        else:
            choice = max(candidates, key=lambda i: (matches[i], -load[i]))
            why = "by_prefix" if matches[choice] else "by_load"
        if why == "by_load":  # nothing held: spread by load, then by what each holds
            choice = min(candidates, key=lambda i: (load[i], self._held[i]))
        elif self._overloaded(load[choice], load[least]):
            choice = min(candidates, key=lambda i: (load[i], -matches[i]))
            why = "overloaded"
        setattr(self.counts, why, getattr(self.counts, why) + 1)
        self.counts.matched_blocks += matches[choice]
        self.counts.blocks += len(chain)
        self._hold(choice, chain)
        if session:
            self._sessions[session] = choice
            self._sessions.move_to_end(session)
            while len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)
        return choice

    def record(self, replica: int, policy: str, ids: Sequence[int] | bytes) -> None:
        """``replica`` now holds ``ids`` of ``policy`` (prompt + completion it answered)."""
        if self.config.policy == "cache_aware":
            self._hold(replica, self._chain(policy, ids))

    def remove(self, replica: int) -> None:
        """Forget all ``replica`` held and the sessions routed to it (it died, or a new
        actor with a cold cache takes its place): their next requests are routed afresh."""
        for key in [k for k in self._blocks if k[0] == replica]:
            del self._blocks[key]
        self._held.pop(replica, None)
        for session in [s for s, r in self._sessions.items() if r == replica]:
            del self._sessions[session]

    def clear(self) -> None:
        """Forget every held prefix (weights changed: the backends dropped their caches);
        sessions keep their replica."""
        self._blocks.clear()
        self._held.clear()

    def held(self, replica: int) -> int:
        """Blocks recorded for ``replica`` (still in the map)."""
        return self._held[replica]

    @property
    def size(self) -> tuple[int, int]:
        """(block entries, session keys) kept: bounded by the config's maxima."""
        return len(self._blocks), len(self._sessions)

    # --- the map -------------------------------------------------------------------------

    def _chain(self, policy: str, ids: Sequence[int] | bytes) -> list[int]:
        """One hash per full block of ``ids``, each chained over the blocks before it."""
        size = self.config.block_tokens * (4 if isinstance(ids, bytes) else 1)
        # (hash() of ints and tuples of ints is the same in every process; of str and bytes
        # it is per process, which is all the map needs: it lives in the front's process.)
        h = hash(policy)
        chain = []
        for start in range(0, len(ids) - size + 1, size):
            block = ids[start : start + size]
            h = hash((h, block if isinstance(block, bytes) else tuple(block)))
            chain.append(h)
        return chain

    def _match(self, replica: int, chain: list[int]) -> int:
        """Leading blocks of ``chain`` that ``replica`` holds."""
        n = 0
        for h in chain:
            if (replica, h) not in self._blocks:
                break
            n += 1
        return n

    def _hold(self, replica: int, chain: list[int]) -> None:
        """Record (or refresh) ``chain`` for ``replica``, deepest block first, so the root
        blocks are the most recent and leaves are evicted before what they extend."""
        blocks = self._blocks
        for h in reversed(chain):
            key = (replica, h)
            if key in blocks:
                blocks.move_to_end(key)
            else:
                blocks[key] = None
                self._held[replica] += 1
        while len(blocks) > self.config.max_blocks:
            (old, _), _ = blocks.popitem(last=False)
            self._held[old] -= 1

    def _overloaded(self, load: int, least: int) -> bool:
        cfg = self.config
        return load - least > cfg.balance_abs_threshold and load > least * cfg.balance_rel_threshold
