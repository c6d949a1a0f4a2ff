"""In-process hints wake the right subscribers, from any thread."""

from __future__ import annotations

import asyncio
import threading

from tether.hints import ANY, Hints


async def test_subscriber_gets_only_its_keys() -> None:
    hints = Hints()
    with hints.subscribe("changed", ["1"]) as sub:
        hints.publish("changed", ["2"])
        assert await sub.get(0.01) == set()
        hints.publish("changed", ["1", "3"])
        assert await sub.get(1) == {"1"}


async def test_publish_from_another_thread_wakes_the_loop() -> None:
    hints = Hints()
    with hints.subscribe("enqueued") as sub:
        threading.Thread(target=hints.publish, args=("enqueued", ["default"])).start()
        assert await sub.get(5) == {"default"}


async def test_publish_all_wakes_everyone_after_a_reconnect() -> None:
    hints = Hints()
    with hints.subscribe("changed", ["9"]) as a, hints.subscribe("control") as b:
        hints.publish_all()
        assert await asyncio.gather(a.get(1), b.get(1)) == [{ANY}, {ANY}]


async def test_closed_subscription_receives_nothing() -> None:
    hints = Hints()
    sub = hints.subscribe("changed")
    sub.close()
    hints.publish("changed", ["1"])
    assert await sub.get(0.01) == set()
