"""A backend whose op calls are rewritten before they run: the frame of the layouts that
let one probe measure an op laid out another way (`batch_order`, `input_gradient_layout`)."""

from __future__ import annotations

__all__ = ["RewrittenCalls"]


class RewrittenCalls:
    """`backend` with every call of `rewritten_ops` passed through `rewrite`; other ops pass
    through unchanged. `run_together` exists only where the backend has it (`layers.run_ops`
    asks), so one XLA compilation still serves a batch of calls."""

    rewritten_ops: frozenset[str] = frozenset()

    def __init__(self, backend):
        self.backend = backend
        if hasattr(backend, "run_together"):
            self.run_together = self._run_together

    def __getattr__(self, name):
        if name == "backend":  # not set yet (copying): no recursion through self.backend
            raise AttributeError(name)
        if name in type(self).rewritten_ops:
            return lambda *args, **kwargs: self._run(name, args, kwargs)
        return getattr(self.backend, name)

    def rewrite(self, name: str, args: tuple, kwargs: dict) -> tuple[str, tuple, dict]:
        raise NotImplementedError

    def _call(self, name: str, args: tuple, kwargs: dict) -> tuple[str, tuple, dict]:
        return self.rewrite(name, tuple(args), dict(kwargs)) if name in self.rewritten_ops else (name, args, kwargs)

    def _run(self, name: str, args: tuple, kwargs: dict):
        name, args, kwargs = self.rewrite(name, args, kwargs)
        return getattr(self.backend, name)(*args, **kwargs)

    def _run_together(self, calls):
        return self.backend.run_together([self._call(*call) for call in calls])
