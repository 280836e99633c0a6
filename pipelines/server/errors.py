"""Errors as Argo Server answers them: grpc-gateway's ``{"code", "message"}`` body, the gRPC
status code in ``code`` and its HTTP status on the response (grpc-gateway's
``HTTPStatusFromCode``), so Hera's and the argo CLI's error handling see what they expect."""

from __future__ import annotations

# gRPC status code -> HTTP status, as grpc-gateway maps them (runtime/errors.go).
INVALID_ARGUMENT = 3
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
UNIMPLEMENTED = 12
INTERNAL = 13
UNAUTHENTICATED = 16

HTTP_STATUS = {INVALID_ARGUMENT: 400, NOT_FOUND: 404, ALREADY_EXISTS: 409,
               PERMISSION_DENIED: 403, UNIMPLEMENTED: 501, INTERNAL: 500, UNAUTHENTICATED: 401}


class ApiError(Exception):
    """A request the server refuses: ``code`` is the gRPC code, ``message`` says why in one line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def body(self) -> dict:
        # grpc-gateway's runtime.Error; "error" is the deprecated copy of "message" that older
        # clients still read.
        return {"code": self.code, "message": self.message, "error": self.message}


def invalid(message: str) -> ApiError:
    return ApiError(INVALID_ARGUMENT, message)


def not_found(namespace: str, name: str, kind: str = "workflows.argoproj.io") -> ApiError:
    # Kubernetes' wording, which Argo passes on: `workflows.argoproj.io "NAME" not found`.
    return ApiError(NOT_FOUND, f'{kind} "{name}" not found (namespace "{namespace}")')


def already_exists(name: str, kind: str = "workflows.argoproj.io") -> ApiError:
    return ApiError(ALREADY_EXISTS, f'{kind} "{name}" already exists')
