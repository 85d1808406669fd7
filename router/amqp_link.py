"""Round robin over ``IM_AMQP_URL``'s nodes: the one reconnect loop of the
broker (``router.broker_rabbitmq``) and the webhook relay (``relay.webhook``).

``AmqpNodes`` holds the URL list (``router.amqp_urls``), the index in use
(``index``; -1: none), the one lost last, and the counts ``reconnects`` (links
restored after a loss) and ``failovers`` (of which on another URL than the one
lost). The caller brings ``attempt(index)``: connect to ``urls[index]`` and set
up there, raising if it cannot (closing what it opened); the link is the
caller's to watch, and ``lost()`` is how it says the link went.

``round`` tries each URL once, from ``first`` on, and raises
``BrokerUnavailable`` naming each failure if none answered (the broker's
start-up). ``rounds`` goes on round after round until an attempt succeeds:
the first round at once; only after a whole round failed does it back off
(0.2 s doubling to ``max_delay_s``) before the next. ``reconnect``, after
``lost()``, does so from the URL after the lost one (the lost one is tried
last in each round).

Each failed attempt is one WARNING line (the URL, its password masked, and the
exception's class and message); an exception of a type a dead or refusing
node does not explain (not in ``EXPECTED``) is one ERROR line with its
traceback instead. The next URL is tried either way.

No task of its own and no clock: ``stopping()`` is asked before each attempt,
``pause(seconds)`` waits out a backoff (``asyncio.sleep`` unless the caller
gives one that a stop cuts short, returning True then); once stopping,
``rounds`` and ``reconnect`` raise ``Stopped``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from aiormq.exceptions import AMQPError

from router.amqp_urls import mask_password
from router.errors import BrokerUnavailable

__all__ = ["EXPECTED", "FIRST_DELAY_S", "AmqpNodes", "Stopped"]

T = TypeVar("T")

# What a failed connect or setup on one node is expected to raise (a node down,
# refusing, timing out, closing the link midway); anything else is a bug or a
# surprise, logged with its traceback.
EXPECTED: tuple[type[BaseException], ...] = (TimeoutError, AMQPError, OSError, ConnectionError,
                                             RuntimeError)
FIRST_DELAY_S = 0.2  # the first backoff, after the first whole round failed; doubled after each


class Stopped(Exception):
    """``rounds`` or ``reconnect`` gave up because the caller is stopping."""


def _never() -> bool:
    return False


async def _sleep(seconds: float) -> bool:
    await asyncio.sleep(seconds)  # looked up at each call (tests patch it)
    return False


class AmqpNodes:
    """The nodes of one ``IM_AMQP_URL``, tried round robin (see the module)."""

    def __init__(self, urls: Sequence[str], log: logging.Logger, *,
                 max_delay_s: float) -> None:
        self.urls: tuple[str, ...] = tuple(urls)
        self.log = log
        self.max_delay_s = max_delay_s
        self.index = -1  # the URL in use now; -1: none
        self.lost_index = -1  # the one in use when the last link was lost
        self.reconnects = 0  # links restored after a loss
        self.failovers = 0  # of which on another URL than the one lost

    def shown(self, index: int) -> str:
        """``urls[index]`` with its password masked (for logs and messages)."""
        return mask_password(self.urls[index])

    def lost(self) -> None:
        """The link on ``index`` is gone: none in use; ``reconnect`` starts after it."""
        if self.index >= 0:
            self.lost_index = self.index
        self.index = -1

    async def round(self, attempt: Callable[[int], Awaitable[T]], first: int = 0, *,
                    stopping: Callable[[], bool] = _never) -> T:
        """``attempt(first)``, else the next, ... each URL once; the first result.

        ``BrokerUnavailable`` ("no RabbitMQ node answered (URL: Error; ...)")
        if none did, or if ``stopping()`` before all were tried."""
        failures: list[str] = []
        for step in range(len(self.urls)):
            i = (first + step) % len(self.urls)
            if stopping():
                break
            try:
                result = await attempt(i)
            except Exception as exc:  # noqa: BLE001 - any failure: try the next node
                failures.append(f"{self.shown(i)}: {self._cause(i, exc)}")
                last = step == len(self.urls) - 1
                self._failed(i, exc, None if last else self.shown((i + 1) % len(self.urls)))
                continue
            self.index = i
            return result
        raise BrokerUnavailable("no RabbitMQ node answered (" + "; ".join(failures) + ")")

    async def rounds(self, attempt: Callable[[int], Awaitable[T]], first: int = 0, *,
                     stopping: Callable[[], bool] = _never,
                     pause: Callable[[float], Awaitable[bool]] = _sleep) -> T:
        """Rounds from ``urls[first]`` until an attempt succeeds (its result):
        the first at once, a backoff after each that failed whole. ``Stopped``
        once ``stopping()``, or when ``pause`` returns True."""
        delay = FIRST_DELAY_S
        while not stopping():
            try:
                return await self.round(attempt, first, stopping=stopping)
            except BrokerUnavailable as exc:
                if stopping():
                    break
                self.log.warning("%s; next round in %.1fs", exc, delay)
                if await pause(delay):
                    break
                delay = min(delay * 2, self.max_delay_s)
        raise Stopped

    async def reconnect(self, attempt: Callable[[int], Awaitable[T]], *,
                        stopping: Callable[[], bool] = _never,
                        pause: Callable[[float], Awaitable[bool]] = _sleep) -> T:
        """After ``lost()``: ``rounds`` from the URL after the lost one (which
        is tried last); counts ``reconnects``, and ``failovers`` if the URL now
        in use is another. ``Stopped`` as ``rounds``."""
        lost = max(self.lost_index, 0)
        result = await self.rounds(attempt, (lost + 1) % len(self.urls), stopping=stopping,
                                   pause=pause)
        self.reconnects += 1
        if self.index != lost:
            self.failovers += 1
        return result

    def _cause(self, index: int, exc: Exception) -> str:
        """``Class: message`` of a failed attempt, the URL's password masked, short."""
        url = self.urls[index]
        text = str(exc).replace(url, mask_password(url)).strip()
        return f"{type(exc).__name__}: {text[:120]}" if text else type(exc).__name__

    def _failed(self, index: int, exc: Exception, next_url: str | None) -> None:
        """One line per failed attempt: the cause and the URL tried next (the last
        of a round says nothing here: the round's line, with the backoff, follows).
        An error of an unexpected kind is a bug: logged with its traceback."""
        shown = mask_password(self.urls[index])
        what = self._cause(index, exc)
        if not isinstance(exc, EXPECTED):
            self.log.error("RabbitMQ at %s: setup failed (%s)", shown, what, exc_info=exc)
        elif next_url is not None:
            self.log.warning("RabbitMQ at %s: setup failed (%s); trying %s next", shown, what,
                             next_url)
