"""A server interceptor that admits each call before its handler runs: a policy sees the method
and the call's context (metadata, verified peer certificate), then refuses the call with
`context.abort` or returns a context manager the handler runs in (to act for the caller)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import grpc

Policy = Callable[[str, grpc.ServicerContext], AbstractContextManager[Any]]

OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")
"""Health (for probes) and reflection (the public schema) answer anyone who completes the handshake."""


class Admission(grpc.ServerInterceptor):
    def __init__(self, policy: Policy, open_prefixes: tuple[str, ...] = OPEN) -> None:
        self.policy = policy
        self.open_prefixes = open_prefixes

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(self.open_prefixes):
            return handler
        policy = self.policy
        deserialize, serialize = handler.request_deserializer, handler.response_serializer
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            def admitted_unary(request: Any, context: grpc.ServicerContext) -> Any:
                with policy(method, context):
                    return unary(request, context)

            return grpc.unary_unary_rpc_method_handler(admitted_unary, deserialize, serialize)
        if handler.unary_stream is not None:
            stream = handler.unary_stream

            def admitted_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                with policy(method, context):
                    yield from stream(request, context)

            return grpc.unary_stream_rpc_method_handler(admitted_stream, deserialize, serialize)

        def refused(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} takes a request stream; none is served")

        return grpc.stream_unary_rpc_method_handler(refused, deserialize, serialize)
