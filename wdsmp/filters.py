"""Pipeline stages: iterator -> iterator functions, curried so they pickle.

A stage is written as a plain generator ``_stage(data, *args)`` and exposed as
``stage = pipelinefilter(_stage)``: ``stage(*args)`` returns a picklable
callable that takes the upstream iterator. Workers are spawned, so stages must
never be lambdas or closures.
"""

__all__ = ["Curried", "pipelinefilter"]


class Curried:
    """``f`` with every argument but the upstream iterator bound; picklable."""

    def __init__(self, f, *args, **kw):
        self.f = f
        self.args = args
        self.kw = kw

    def __call__(self, data):
        return self.f(data, *self.args, **self.kw)

    def __repr__(self):
        return f"<{self.f.__name__} {self.args} {self.kw}>"


class _StageFactory:
    """What ``pipelinefilter`` returns: call it with a stage's arguments."""

    def __init__(self, f):
        self.f = f
        self.__name__ = getattr(f, "__name__", "stage").lstrip("_")
        self.__doc__ = f.__doc__

    def __call__(self, *args, **kw):
        return Curried(self.f, *args, **kw)

    def __repr__(self):
        return f"<stage {self.__name__}>"


def pipelinefilter(f):
    """Turn ``f(data, *args, **kw)`` into a stage constructor ``stage(*args, **kw)``."""
    return _StageFactory(f)
