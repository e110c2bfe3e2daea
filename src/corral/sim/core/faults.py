"""Injected failures, decided per inference request in arrival order: error answers, a hung engine, a crash.

- `--fail-rate F`: that fraction of requests gets a 500 InternalServerError (a seeded, repeatable sequence);
  `--fail-rate-after N` spares the first N (a bundle that passes its smoke tests, then fails real traffic).
- `--hang-after N`: requests after the N-th are accepted and counted as running but never produce a token,
  while `/health` stays 200 (vLLM's hung engine core).
- `--crash-after N`: the (N+1)-th request kills the process (exit 1) with the others still in flight.
- `--gpu-fault KIND` (`--gpu-fault-after N`, default 0): the (N+1)-th request dies of a GPU fault: the
  CUDA, out-of-memory or NCCL lines vLLM and torch print (corral.sim.core.gpu_fault_lines), then exit 1.
- `--wrong-answer KIND` (`--wrong-answer-after N`): requests after the N-th are answered 200 with a body
  that is no completion of this model (another model's, an error object, no choices).
"""

from __future__ import annotations

import enum
import random


class Fault(enum.Enum):
    NONE = "none"
    FAIL = "fail"
    HANG = "hang"
    CRASH = "crash"
    GPU = "gpu"
    WRONG = "wrong"


class FaultInjector:
    def __init__(
        self,
        fail_rate: float = 0.0,
        crash_after: int | None = None,
        hang_after: int | None = None,
        seed: int = 0,
        fail_rate_after: int = 0,
        gpu_fault_after: int | None = None,
        wrong_answer_after: int | None = None,
    ) -> None:
        self.fail_rate = fail_rate
        self.fail_rate_after = fail_rate_after
        self.crash_after = crash_after
        self.hang_after = hang_after
        self.gpu_fault_after = gpu_fault_after
        self.wrong_answer_after = wrong_answer_after
        self._rng = random.Random(seed * 7919 + 17)
        self.seen = 0

    def next(self) -> Fault:
        """The fault for the next inference request (counts it)."""
        self.seen += 1
        if self.crash_after is not None and self.seen > self.crash_after:
            return Fault.CRASH
        if self.gpu_fault_after is not None and self.seen > self.gpu_fault_after:
            return Fault.GPU
        if self.wrong_answer_after is not None and self.seen > self.wrong_answer_after:
            return Fault.WRONG
        if self.hang_after is not None and self.seen > self.hang_after:
            return Fault.HANG
        if self.fail_rate > 0 and self.seen > self.fail_rate_after and self._rng.random() < self.fail_rate:
            return Fault.FAIL
        return Fault.NONE
