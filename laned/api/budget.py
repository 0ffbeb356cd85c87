"""One ceiling on the memory laned holds for requests in flight, for the whole process.

Each request limit (`daemon.limits.max_body_mib`) bounds one request; 128 clients each under
it took laned past 3 GB (issue 53). The budget bounds them together: a request with a body
claims its bytes — twice the body, for the copies it makes on its way to the engine (what
`bench/request_budget.py` measured: the body, then the write to the engine or the pipe to
the body parser beside it) — before its body is read, and gives them back once the body has
gone to the engine, or its answer has ended, or its client has gone. A claim that does not
fit waits in arrival order, its body unread (the listener reads no more of it: it stays in
the kernel's socket buffer, not in laned), for up to `request_memory_wait`; then it is
answered 503 with Retry-After (laned.api.limits). The budget grants in arrival order, so a
stream of small requests cannot starve a large one.

Sized by `daemon.limits.request_memory_mib`, by default from the host's memory
(`default_capacity`). Everything here runs on the event loop: no lock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

MIB = 1024 * 1024
# The default ceiling: this share of the host's memory (laned's cgroup limit where lower),
# between these bounds.
SHARE, FLOOR, CEILING = 1 / 32, 256 * MIB, 2048 * MIB
# Claims that may wait at once; the next is refused at once. Each waiting request holds at
# most what the listener read with its head (one socket read, 256 KiB), so this bounds the
# memory of requests that wait for the memory of others.
MAX_WAITING = 64


def default_capacity(memory_total: int | None) -> int:
    """The budget laned takes when `request_memory_mib` is not set: a 32nd of the memory it
    may use, no less than 256 MiB and no more than 2 GiB (256 MiB when it is not known)."""
    if memory_total is None:
        return FLOOR
    return int(min(CEILING, max(FLOOR, memory_total * SHARE)))


class Claim:
    """One request's share of the budget: `size` bytes held, `pending` more waited for."""

    def __init__(self, budget: Budget, granted: Callable[[], None]) -> None:
        self.budget, self.granted = budget, granted
        self.size = 0  # held in the budget
        self.pending = 0  # waited for
        self.ended = False
        self._settled = asyncio.Event()  # held, or ended without being held

    async def settled(self) -> bool:
        """Until the claim is held (True) or has ended unheld (False: refused, its client gone)."""
        if not self.pending:
            return not self.ended
        await self._settled.wait()
        return not self.ended

    def _grant(self) -> None:
        self.granted()
        self._settled.set()

    def grow(self, size: int) -> bool:
        """Claim `size` more (a chunked body longer than claimed so far): True when it is
        held now; else it waits, first in line, and `granted` is called when it is held."""
        return self.budget.ask(self, size, first=True)

    def release(self) -> None:
        """Give back what is held and stop waiting (idempotent)."""
        if not self.ended:
            self.ended = True
            self.budget.release(self)
            self._settled.set()


class Budget:
    """The bytes of requests in flight, against one ceiling (`capacity`)."""

    def __init__(self, capacity: int, emptied: Callable[[], None] | None = None) -> None:
        self.capacity = capacity
        # Called when the last claim is given back: laned gives the memory the burst left in
        # the C library's heap back to the kernel (laned.daemon).
        self.emptied = emptied
        self.held = 0
        self.peak = 0
        self.refused = 0  # requests answered 503 for want of room (counted by the listener)
        self.waited = 0  # claims that had to wait
        self._waiting: deque[Claim] = deque()

    def claim(self, size: int, granted: Callable[[], None]) -> Claim | None:
        """A claim of `size` bytes: held at once when it fits and nobody waits before it, else
        waiting (`granted` is called when it is held); None when MAX_WAITING wait already."""
        claim = Claim(self, granted)
        waits = bool(self._waiting) or not self._fits(size)
        if waits and len(self._waiting) >= MAX_WAITING:
            return None
        self.ask(claim, size)
        return claim

    def waiting(self) -> int:
        """Claims waiting for room now."""
        return len(self._waiting)

    def ask(self, claim: Claim, size: int, first: bool = False) -> bool:
        """Hold `size` more for `claim`: at once when it fits and nobody waits, True; else
        the claim waits for it, in arrival order (`first`: before everyone, for a body that
        has begun and holds memory already), False."""
        if not self._waiting and self._fits(size, claim):
            self._hold(claim, size)
            return True
        claim.pending += size
        self.waited += 1
        if first:
            self._waiting.appendleft(claim)
        else:
            self._waiting.append(claim)
        return False

    def release(self, claim: Claim) -> None:
        held, self.held = self.held, self.held - claim.size
        claim.size = claim.pending = 0
        if claim in self._waiting:
            self._waiting.remove(claim)
        self._grant()
        if held and not self.held and self.emptied is not None:
            self.emptied()

    def _fits(self, size: int, claim: Claim | None = None) -> bool:
        # A claim larger than the whole budget is held alone (never refused for its size: the
        # config keeps a body at max_body_mib within the budget).
        alone = self.held == (claim.size if claim is not None else 0)
        return self.held + size <= self.capacity or alone

    def _hold(self, claim: Claim, size: int) -> None:
        claim.size += size
        self.held += size
        self.peak = max(self.peak, self.held)

    def _grant(self) -> None:
        """Hold the waiting claims that fit now, in arrival order; stop at the first that
        does not (no overtaking)."""
        while self._waiting and self._fits(self._waiting[0].pending, self._waiting[0]):
            claim = self._waiting.popleft()
            size, claim.pending = claim.pending, 0
            self._hold(claim, size)
            claim._grant()
