"""An integer shared with the worker processes a DataLoader starts: NOTE [shared epoch].

NOTE [shared epoch]: with ``persistent_workers=True`` a DataLoader's workers
keep the copies of the dataset they got when they started, so a
``set_epoch(n)`` called on the dataset in the main process never reaches
them. A stage whose epoch is a :class:`SharedInt` reads it from shared
memory instead: the workers started after the SharedInt was made, forked or
spawned, see every later assignment, when their next epoch starts. The
value is an int64 in multiprocessing's shared heap, without a lock (one
writer; a reader takes a whole aligned word). Pickled outside process
creation (``pickle.dumps``, ``copy.deepcopy``) it travels as a plain
number and the copy gets shared memory of its own, as multiprocessing
allows shared memory to cross only into a process being started.
"""

import multiprocessing
import multiprocessing.context
from typing import Any, Dict

__all__ = ["SharedInt"]


class SharedInt:
    """An int whose assignments reach the processes started after it was made."""

    def __init__(self, value: int = 0) -> None:
        self._cell = multiprocessing.RawValue("q", value)

    @property
    def value(self) -> int:
        return self._cell.value

    @value.setter
    def value(self, value: int) -> None:
        self._cell.value = value

    def __getstate__(self) -> Dict[str, Any]:
        if multiprocessing.context.get_spawning_popen() is not None:  # a worker being started
            return {"cell": self._cell}
        return {"value": self._cell.value}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._cell = state["cell"] if "cell" in state else multiprocessing.RawValue("q", state["value"])

    def __repr__(self) -> str:
        return f"SharedInt({self.value})"
