"""Exceptions: one class per pagedkv status code, all subclasses of PagedKvError.

Every failed call changes nothing in the cache (the C++ contract), then raises one of these.
"""
from __future__ import annotations

from . import _C

StatusCode = _C.StatusCode


class PagedKvError(Exception):
    """A pagedkv call failed. `.code` is the StatusCode, `.message` the C++ message."""

    code: StatusCode = StatusCode.INTERNAL

    def __init__(self, code: int | StatusCode, message: str) -> None:
        self.code = StatusCode(code)
        self.message = message
        super().__init__(f"{self.code.name}: {message}")

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.code.value, self.message))


class InvalidArgumentError(PagedKvError, ValueError):
    """A malformed argument (bad shape, dtype, device, capacity)."""


class NotFoundError(PagedKvError, KeyError):
    """An id that does not exist (unknown sequence)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return Exception.__str__(self)


class AlreadyExistsError(PagedKvError):
    """An id that exists already (duplicate sequence)."""


class OutOfRangeError(PagedKvError, IndexError):
    """An index past a bound (layer, position, max_sequence_length)."""


class FailedPreconditionError(PagedKvError):
    """A valid call, but not now (commit before reserve, a stale batch)."""


class ResourceExhaustedError(PagedKvError):
    """Out of blocks or out of memory."""


class UnavailableError(PagedKvError):
    """The backend or device is not present."""


class UnimplementedError(PagedKvError, NotImplementedError):
    """Not supported by this build or backend."""


class InternalError(PagedKvError):
    """A broken invariant or a backend (CUDA) failure."""


ERROR_CLASSES: dict[StatusCode, type[PagedKvError]] = {
    StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    StatusCode.NOT_FOUND: NotFoundError,
    StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    StatusCode.OUT_OF_RANGE: OutOfRangeError,
    StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    StatusCode.UNAVAILABLE: UnavailableError,
    StatusCode.UNIMPLEMENTED: UnimplementedError,
    StatusCode.INTERNAL: InternalError,
}

for _code, _cls in ERROR_CLASSES.items():
    _cls.code = _code
_C._register_error_classes({code.value: cls for code, cls in ERROR_CLASSES.items()})
