"""The parley message bus: named asyncio endpoints over ZeroMQ.

An :class:`Endpoint` is one named participant (an agent, the arena, the pool, a trainer).
It may ``bind`` (a ZeroMQ ROUTER socket that many peers connect to) and ``connect`` (one
DEALER socket per remote endpoint), in any combination, over ``inproc://``, ``ipc://`` or
``tcp://`` with the same API. Every frame is an :class:`~parley.protocols.messages.Envelope`
encoded by :class:`~parley.protocols.codec.Codec`; ``protocols/PROTOCOL.md`` documents the
wire format for implementers in other languages.

Example::

    async with Endpoint("arena") as arena, Endpoint("alice") as alice:
        async def act(env: Envelope) -> Action:
            return Action(agent="alice", text="I accept")

        alice.on(Observation, act)
        address = await arena.bind("ipc:///tmp/parley-arena")  # or tcp://127.0.0.1:0
        await alice.connect(address)  # returns "arena"
        action = await arena.request("alice", Observation(agent="alice", text="Offer?"))

Contracts
---------
* **Handshake.** ``connect`` sends ``Hello`` and returns the remote name once the remote's
  ``Hello`` reply arrives. A bound endpoint refuses a name that is already connected and
  alive (``Error(duplicate_name)``) and a peer that does not speak this schema version
  (``Error(unsupported_version)``). Any other message from a socket that has not said
  ``Hello`` is answered with ``Error(hello_required)``.
* **Requests.** ``request`` returns the reply body, or raises :class:`RemoteError` (the
  peer answered ``Error``), :class:`PeerDead` (the peer died or said ``Bye`` while the request
  was pending) or :class:`RequestTimeout`. Every request ends in exactly one of these.
  A timeout counts the time this endpoint ran: when its deadline timer fires more than
  50 ms late (the process stopped or descheduled, its loop blocked), the deadlines of the
  requests sent before are put off by that stall, in all by at most their own limit, so
  that replies that arrived meanwhile are read first.
  Either side of a connection may send requests. Handlers registered with :meth:`Endpoint.on`
  answer them: a handler returning ``None`` replies ``Ok``; a handler raising replies
  ``Error(handler_failed)``; an unknown kind gets ``Error(no_handler)``.
* **Handlers run eagerly.** A handler's coroutine is started inside the receive loop; if it
  finishes without suspending (the common case: a table lookup, a queue put) its reply is
  sent at once and no task is created; if it suspends, it continues as a task, so a slow
  handler never blocks the receive loop. Handlers therefore must not block the thread.
* **Liveness.** Each side sends ``Heartbeat`` when it has sent nothing else to a peer for
  ``heartbeat_interval``. A peer whose connection closed (its process died) is dead once it
  has been silent for 2.5 heartbeat intervals; a peer whose connection is open (busy, paused)
  only after ``peer_timeout`` (60 s by default, at least 2.5 of its announced heartbeat
  intervals). A dead peer's pending requests fail with :class:`PeerDead` and it leaves
  :attr:`Endpoint.peers`. A ``Bye`` has the same effect at once; so does a bound socket
  finding the peer's connection gone when it sends to it (ZeroMQ's ``EHOSTUNREACH``). A
  connecting endpoint whose peer died keeps its socket and repeats the handshake when the
  peer comes back (ZeroMQ reconnects by itself); :meth:`Endpoint.farewell` tells a peer that
  said ``Bye`` from one that was lost. Silence
  counts only while the local event loop runs on time (time it was stalled is credited to
  every peer), and peers over ``inproc://`` (in this process) never die of silence.
* **Broadcast.** ``subscribe(prefix, handler)`` tells every peer (and every later peer, in
  its ``Hello``) to forward broadcasts whose channel starts with ``prefix``; ``publish``
  sends one copy to each peer that asked. Broadcast is one hop: an endpoint does not relay.
* **CURVE.** With ``BusConfig.curve_secret_key`` set, ``tcp://`` binds are CURVE servers that
  admit only ``curve_allowed_clients`` (checked by a ZAP handler), and ``tcp://`` connects
  authenticate with the server's public key ``curve_server_key``. A peer without the right
  keys completes no handshake, so it can neither send nor receive. Without keys ``tcp://``
  is plain text: keep it on trusted networks (or 127.0.0.1).
* **Identity.** A connecting DEALER's routing id is ``"<name>/<random hex>"``: stable across
  ZeroMQ's automatic reconnects, new for a new process, so a restarted peer is a new
  connection that a bound endpoint can tell from a live duplicate (it probes the old one).

Bounds, and why
---------------
* ``LINGER 0`` on every socket: closing an endpoint never waits on unsent messages (a dead
  peer must not hang shutdown). ``close()`` sends ``Bye`` first, best effort.
* ``hwm`` (default 10,000 messages, each direction, per connection) caps what ZeroMQ
  buffers for a slow or dead peer: with 4 KB messages ~40 MB, far above one scenario's
  traffic yet small enough that a stuck peer cannot exhaust memory. A send that finds the
  queue full waits (with back-off) up to the request timeout, then fails with
  :class:`BusError`; a reply that finds it full is retried the same way in a task.
* ``max_pending`` (10,000) bounds requests awaiting replies: past it ``request`` raises
  :class:`BusError` at once instead of queueing without limit (the caller is outpacing the
  peer and should await earlier replies).
* ``max_handlers`` (1,000) bounds handler tasks running at once; beyond it requests are
  answered ``Error(overloaded, retryable=True)`` so a flood cannot grow tasks without end.
* A connection that has not said ``Hello`` gets only a single frame of at most 64 KiB
  decoded, and only a ``Hello``, ``Heartbeat`` or ``Bye`` body: anything else is answered
  ``hello_required`` (requests) or dropped, unread. A stranger's 7 MiB of MessagePack empty
  lists decoded to ~630 MB of Python lists and held the loop 2 s, long enough for the
  other peers to declare this endpoint dead.
* ``max_subscriptions`` (256 prefixes of at most 256 characters per peer): the prefixes are
  kept per peer and scanned on every ``publish``. Peer names are 1-200 bytes without NUL,
  and the errors a peer sends are logged at most once a second, cut short.

Implementation notes: each socket has one receive loop, driven by the event loop when the
socket's descriptor turns readable; ``receive.py`` says why. ZeroMQ's descriptor is
edge-triggered and a send can consume the edge, so a send made outside the loop queues one
more drain for the end of the current event-loop round.

Parts
-----
An :class:`Endpoint` is composed of parts that it holds, each with a narrow public surface;
a module imports only the modules before it in this table:

====================  ====================================================================
``config.py``         :class:`BusConfig` (timing, bounds, keys) and :class:`BusStats`
``core.py``           what every part shares: ``Link`` (a connection to a named peer),
                      ``Sock`` (a socket and its receive-loop flags), ``Routes`` (the
                      handlers), ``Shared`` (name, config, stats, codec, loop, clock, tasks)
``registry.py``       ``Registry``: the sockets and the links by peer name; declares a peer
                      dead and fails its pending requests
``send.py``           ``Sender``: non-blocking sends, back-off when a queue is full, replies
``requests.py``       ``Requests``: request ids, the futures awaiting replies, deadlines
``links.py``          ``Liveness``: the handshake, admission, heartbeats, goodbyes
``refuse.py``         ``RefusalPolicy``: what a peer should not have sent (strangers, floods,
                      undecodable messages), refused without costing the loop
``receive.py``        ``ReceiveLoop``: drains each socket, routes replies to their futures,
                      session messages to ``Liveness``, the rest to the handlers (eagerly)
``auth.py``           CURVE socket options and the ZAP handler that admits client keys
``endpoint.py``       :class:`Endpoint`: the public API; makes, registers and closes sockets
====================  ====================================================================

How a request flows: ``Endpoint.request`` finds the live link in the ``Registry`` and hands
it to ``Requests.request``, which takes a fresh id, encodes the envelope (``Sender.encode``),
puts a future in the link's ``pending`` table, arms its deadline and sends
(``Sender.send_now``, or ``send_later`` while the queue is full). On the peer, the socket's
``ReceiveLoop.drain`` reads the frames, decodes them and starts the handler registered for
the body's type; its result goes back by ``Sender.reply``. Back here, ``drain`` pops the
future by ``reply_to`` and resolves it (an ``Error`` body raises :class:`RemoteError`). If
the deadline comes first, ``Requests`` fails it with :class:`RequestTimeout`; if the peer
dies first (``Liveness``'s ticker, a ``Bye``, ``EHOSTUNREACH``), ``Registry.peer_died``
fails it with :class:`PeerDead`.
"""

from parley.protocols.bus.config import BusConfig, BusStats
from parley.protocols.bus.core import Admission, Handler
from parley.protocols.bus.endpoint import Endpoint

__all__ = ["Admission", "BusConfig", "BusStats", "Endpoint", "Handler"]
