"""Review (H9) of Ray's HeadWatch: once the run has called ``end()``, the watch's thread
never ends the process (its last resort, ``on_stuck`` and ``os._exit``, raced the loop:
a loop that handled the verdict just as ``stuck_after_s`` ran out had ``end()`` return
while the thread went on writing the summary and files the loop was writing, then exited 4
under the loop's feet)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A real closed port (the kernel refuses it) stands for the dead head's GCS; ``ray`` is
# only asked for that address, so a namespace carrying it stands for the client.
SCRIPT = textwrap.dedent(
    """
    import asyncio, socket, sys, threading, time, types
    from parley.arena.run.ray_cluster import HeadWatch

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    context = types.SimpleNamespace(gcs_address=f"127.0.0.1:{port}")
    ray = types.SimpleNamespace(get_runtime_context=lambda: context)
    entered, gate = threading.Event(), threading.Event()

    def stuck():
        entered.set()
        gate.wait(5)  # writing the partial summary
        return "after 3 of 9 episodes"

    async def main():
        watch = HeadWatch(ray, lost_after_s=0.2, every_s=0.05, stuck_after_s=0.3,
                          on_stuck=stuck)
        await watch.start()
        while not entered.is_set():  # the loop comes back just as the thread gives up
            await asyncio.sleep(0.01)
        threading.Timer(0.3, gate.set).start()
        watch.end()
        print("END RETURNED", flush=True)
        time.sleep(1.5)  # the loop's own writes, after end()

    asyncio.run(main())
    """
)


def test_no_last_resort_exit_after_end_returned() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    ended = "END RETURNED" in done.stdout
    assert done.returncode in (0, 4), done.stderr
    # Either the last resort ran whole (status 4, end() held until it did) or the loop
    # went on alone (status 0): never end() returning and the process killed after it.
    assert not (ended and done.returncode == 4), (done.stdout, done.stderr)
    assert ended == (done.returncode == 0)
