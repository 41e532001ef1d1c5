"""One error hierarchy. Each error knows its HTTP status and its OpenAI error ``type``/``code``;
the surfaces (FastAPI handlers, Lambda, SageMaker) only render it."""

from __future__ import annotations


class TesseraError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {}


class InvalidInput(TesseraError):
    status, type, code = 400, "invalid_request_error", "invalid_input"


class Unauthorized(TesseraError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class ModelNotFound(TesseraError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class NotFound(TesseraError):
    status, type, code = 404, "invalid_request_error", "not_found"


class MethodNotAllowed(TesseraError):
    status, type, code = 405, "invalid_request_error", "method_not_allowed"


class Unsupported(TesseraError):
    """The model exists but cannot do what was asked (a task it lacks, an option it has no use for)."""

    status, type, code = 400, "invalid_request_error", "unsupported"


class TooLarge(TesseraError):
    status, type, code = 413, "invalid_request_error", "too_large"


class ClientClosed(TesseraError):
    """The client went away before its answer was ready (nginx's 499); nobody reads this response."""

    status, type, code = 499, "invalid_request_error", "client_closed_request"


class HttpStatus(TesseraError):
    """An HTTP error the framework raised outside our routes (e.g. Starlette's), in our error shape."""

    def __init__(self, message: str, *, status: int):
        super().__init__(message)
        self.status = status


class ValidationFailed(TesseraError):
    status, type, code = 422, "invalid_request_error", "validation_error"


class Overloaded(TesseraError):
    status, type, code = 429, "rate_limit_error", "overloaded"

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class NotReady(TesseraError):
    status, type, code = 503, "server_error", "not_ready"

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(max(1, round(self.retry_after)))}


class RequestTimeout(TesseraError):
    """The request (its body) did not arrive in time."""

    status, type, code = 408, "invalid_request_error", "request_timeout"


class BackendFailure(TesseraError):
    status, type, code = 500, "server_error", "backend_failure"


class OutOfMemory(BackendFailure):
    """The runtime ran out of memory on a batch; the engine retries it in halves before failing it."""

    code = "out_of_memory"


class Timeout(TesseraError):
    status, type, code = 504, "timeout_error", "deadline_exceeded"


class ModelUnavailable(TesseraError):
    """A model's files cannot be had: no such folder, a Hub id that is not cached while offline, a
    repository, revision or file the Hub does not have."""

    status, type, code = 503, "server_error", "model_unavailable"


class StartupFailed(TesseraError):
    """The configured models cannot be served as asked (none loaded, or some failed without allow_degraded)."""

    status, type, code = 503, "server_error", "startup_failed"


class ConfigError(TesseraError):
    """Settings that cannot be used: one line per problem (field, value, a suggestion)."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))
        self.problems = problems


class MissingDependency(TesseraError):
    """An optional dependency is absent; the message names the extra to install."""

    status, type, code = 503, "server_error", "missing_dependency"


def install_hint(extra: str) -> str:
    """The command that installs an extra of this project, from its checkout."""
    return f"pip install -e '.[{extra}]' (in the Tessera checkout)"


def require(module: str, extra: str):
    """Import an optional dependency or fail with the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(f"{module} is not installed: {install_hint(extra)} ({exc})") from exc
