"""The one way stepfork changes other people's code: a :class:`Patcher` per set of patches.

stepfork replaces attributes it does not own in four places: an LLM SDK's ``request`` and its HTTP
client's ``send`` (``recording/integrations/sdk.py``), the socket and HTTP entry points of the
replay network guard (``replay/network.py``), the clock, ``random``, uuid, random-bytes and
environment reads of a capturing run (``recording/determinism.py``), and the OpenTelemetry SDK's
private tuple of processors that the redacting processors go first in (``otel/redacting.py``).
Each goes through a :class:`Patcher`, which holds to these rules:

* **It remembers what it replaced**, as the owner held it: its own value, or that the attribute
  was inherited (a class attribute from a base class) -- then undoing deletes it again, so that
  it is inherited again rather than copied into the owner.
* **The object that applied a patch undoes it**: :meth:`Patcher.restore` and
  :meth:`~Patcher.restore_all` put back only what that patcher replaced.
* **Idempotent**: wrapping an attribute that holds one of the patcher's replacements does
  nothing, and so does restoring one that holds none.
* **Beside other patchers of the same attribute.** When another library replaced the attribute
  after this patcher did (an instrumentation's ``wrapt`` wrapper around ours), undoing leaves
  theirs in place; ours inside it must then do nothing, which each user checks on its own (an
  instrumented SDK, an active guard, a capturing run). A wrapper this patcher made carries, in
  its *own* ``__dict__``, what it replaced and which patcher made it: a copy of it that another
  library put back when that library was undone is recognised and undone too. The mark is read
  from the function's own ``__dict__``, never through ``getattr``: a proxy around one of ours
  hands out our attributes as its own, and undoing stepfork would take that library's wrapper
  off with it.
* **Thread-safe**: every change and every undoing is made under the patcher's lock.
* **No reference that outlives the owner**: an instance patched (one SDK client) is held weakly,
  so a client dropped without being undone is collected as before (classes and modules, which
  live as long as the process, are held as they are).

Why a module of our own and not ``wrapt`` (the ecosystem's wrapper library): what is needed is
the ledger -- what was replaced, inherited or not, undone by the same object, a copy recognised
-- which ``wrapt`` does not keep (``wrapt.wrap_function_wrapper`` replaces, and undoing is left to
the caller), and most of what is replaced here is not a function wrapper at all: the capture's
``datetime`` classes and module proxy, ``os._Environ.__getitem__``, a tuple of processors. Nor
is a ``wrapt`` wrapper cheaper: measured against the plain function wrappers kept here (wrapt
2.5.2 with its C extension, CPython 3.11, best of 7), a pass-through ``FunctionWrapper`` around
``time.time`` cost 20-70 ns more per call, and around a method 240-360 ns more (it builds a
bound wrapper at each attribute access). And it would be a new dependency. The wrappers stay
plain functions, which also keeps other instrumentations' ``wrapt`` wrappers around ours
working as they do today (``integrations/sdk.py`` binds them as Python binds a method).
"""

from __future__ import annotations

import threading
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["MARK", "Patcher"]

MARK = "__stepfork_original__"
"""The attribute, in a wrapper's own ``__dict__``, that says what it replaced and who made it."""

_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class _Mark:
    patcher: Patcher
    replaced: Any


@dataclass(slots=True)
class _Applied:
    owner_ref: Any
    """The owner -- or, for an instance (not a class or a module), a weak reference to it."""
    weak: bool
    name: str
    had_own: bool
    """The attribute was in the owner's own ``__dict__`` (else inherited, or absent)."""
    previous: Any
    """The owner's own value before (when ``had_own``)."""
    replacement_ref: Any
    """What was set (weakly too for an instance: a method bound to it refers to it)."""
    first: Any = _MISSING
    """For :meth:`Patcher.put_first`: the item put first (undone by taking it out again)."""

    def owner(self) -> Any:
        return self.owner_ref() if self.weak else self.owner_ref

    def replacement(self) -> Any:
        return self.replacement_ref() if self.weak else self.replacement_ref


def _weakly(value: Any) -> Callable[[], Any]:
    """A weak reference to ``value``, or a function returning it when it has none (a tuple)."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: value


def _own(owner: Any, name: str) -> Any:
    """``owner``'s own value of ``name`` (``_MISSING``: not in its ``__dict__``)."""
    try:
        return vars(owner).get(name, _MISSING)
    except TypeError:  # no __dict__ (slots): what it says is its own
        return getattr(owner, name, _MISSING)


def _set(owner: Any, name: str, had_own: bool, value: Any) -> None:
    if had_own:
        setattr(owner, name, value)
    elif name in vars(owner):
        delattr(owner, name)  # inherited again (or absent again), not copied in


class Patcher:
    """A set of patches of other people's code, applied and undone by this object (see the
    module docstring). ``what`` names it in errors and reprs."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._lock = threading.Lock()
        self._applied: dict[tuple[int, str], _Applied] = {}
        self._prune_at = 64
        """Dead owners (instances collected) are forgotten when the ledger reaches this size."""

    def __repr__(self) -> str:
        return f"Patcher({self.what!r}, {len(self)} applied)"

    def __len__(self) -> int:
        with self._lock:
            self._prune()
            return len(self._applied)

    # -- what is ours ----------------------------------------------------------------------------

    def replaced(self, value: Any) -> Any:
        """What ``value`` replaced when it is a wrapper this patcher made (wherever it is now:
        a copy put back by another library included), else None. Read from the function's
        own ``__dict__``, never through a proxy."""
        if type(value) is not types.FunctionType:
            return None
        mark = value.__dict__.get(MARK)
        return mark.replaced if isinstance(mark, _Mark) and mark.patcher is self else None

    def owns(self, owner: Any, name: str) -> bool:
        """Whether ``owner.name`` holds one of this patcher's replacements."""
        with self._lock:
            return self._ours(owner, name, _own(owner, name))

    def _ours(self, owner: Any, name: str, value: Any) -> bool:
        applied = self._applied.get((id(owner), name))
        if applied is not None and applied.owner() is owner and applied.replacement() is value:
            return value is not None
        return self.replaced(value) is not None

    def _prune(self) -> None:
        dead = [key for key, applied in self._applied.items() if applied.owner() is None]
        for key in dead:
            del self._applied[key]

    # -- applying ------------------------------------------------------------------------------

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
        """Replace ``owner.name`` by ``make(current)`` -- ``current``: the owner's own value, or
        the one it inherits -- and return the replacement; None (nothing changed) when the
        attribute is absent or already one of this patcher's. A function replacement is marked
        with what it replaced. An exception from ``make`` or from setting the attribute leaves
        nothing changed and nothing recorded."""
        with self._lock:
            own = _own(owner, name)
            current = own if own is not _MISSING else getattr(owner, name, None)
            if current is None or self._ours(owner, name, current):
                return None
            replacement = make(current)
            if type(replacement) is types.FunctionType:
                replacement.__dict__[MARK] = _Mark(self, current)
            self._record(owner, name, own, replacement)
            return replacement

    def replace(self, owner: Any, name: str, value: Any) -> bool:
        """Set ``owner.name = value``, remembering what was there; False (nothing changed) when
        it holds ``value`` already."""
        with self._lock:
            return self._replace(owner, name, value)

    def replace_many(self, patches: Iterable[tuple[Any, str, Any]]) -> None:
        """:meth:`replace` for each ``(owner, name, value)``, under one taking of the lock (the
        determinism capture sets some thirty names at each run's start). An exception leaves
        the patches made before it in place, recorded (:meth:`restore_all` undoes them)."""
        with self._lock:
            for owner, name, value in patches:
                self._replace(owner, name, value)

    def _replace(self, owner: Any, name: str, value: Any) -> bool:
        own = _own(owner, name)
        if own is value:
            return False
        self._record(owner, name, own, value)
        return True

    def put_first(self, owner: Any, name: str, item: Any) -> None:
        """Put ``item`` first in the tuple ``owner.name`` (a private sequence of another
        library's object, replaced whole as its owner replaces it: the OpenTelemetry SDK's
        processors). Undone by taking ``item`` out of whatever tuple is there then, so that what
        was added since stays. The caller holds the owner's own lock, if it has one."""
        with self._lock:
            own = _own(owner, name)
            current = tuple(getattr(owner, name))
            self._record(owner, name, own, (item, *current), first=item)

    def _record(self, owner: Any, name: str, own: Any, value: Any, first: Any = _MISSING) -> None:
        setattr(owner, name, value)
        if len(self._applied) >= self._prune_at:  # (amortised: not a walk per patch)
            self._prune()
            self._prune_at = max(64, 2 * len(self._applied))
        if isinstance(owner, (type, types.ModuleType)):  # lives as long as the process
            applied = _Applied(owner, False, name, own is not _MISSING, own, value, first)
        else:  # an instance: never kept alive by its patch
            applied = _Applied(
                weakref.ref(owner), True, name, own is not _MISSING, own, _weakly(value), first
            )
        self._applied[(id(owner), name)] = applied

    # -- undoing -------------------------------------------------------------------------------

    def restore(self, owner: Any, name: str) -> bool:
        """Undo this patcher's patch of ``owner.name``: what it replaced is put back when the
        attribute still holds the replacement (or a copy of one of its wrappers); another
        library's replacement made since is left in place. Whether something was put back."""
        with self._lock:
            return self._restore(owner, name, self._applied.pop((id(owner), name), None))

    def restore_all(self) -> None:
        """Undo every patch of this patcher, the last applied first."""
        with self._lock:
            applied = list(self._applied.values())
            self._applied.clear()
            for patch in reversed(applied):
                owner = patch.owner()
                if owner is not None:
                    self._restore(owner, patch.name, patch)

    def _restore(self, owner: Any, name: str, applied: _Applied | None) -> bool:
        own = _own(owner, name)
        if applied is not None and applied.owner() is not owner:
            applied = None  # (an id reused by another object)
        if applied is not None and applied.first is not _MISSING:
            if not isinstance(own, tuple) or applied.first not in own:
                return False
            setattr(owner, name, tuple(item for item in own if item is not applied.first))
            return True
        if applied is not None and own is not _MISSING and own is applied.replacement():
            _set(owner, name, applied.had_own, applied.previous)
            return True
        previous = self.replaced(own)
        if previous is None:
            return False  # not ours (any more): another library's, or undone already
        # A copy of one of our wrappers that another library put back when it was undone.
        setattr(owner, name, previous)
        return True
