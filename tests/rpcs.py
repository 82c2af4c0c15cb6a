"""Call any method of a gRPC service by its descriptor, so a test can try every RPC there is."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor


def methods(service: ServiceDescriptor) -> list[MethodDescriptor]:
    return list(service.methods)


def status_of(
    channel: grpc.Channel,
    method: MethodDescriptor,
    metadata: Sequence[tuple[str, str]] = (),
    timeout: float = 2,
) -> tuple[grpc.StatusCode, str]:
    """Send `method` an empty request; the status it ends with (OK for a unary answer or a first
    streamed message; DEADLINE_EXCEEDED for a stream admitted but silent) and its details."""
    request_type = message_factory.GetMessageClass(method.input_type)
    response_type = message_factory.GetMessageClass(method.output_type)
    path = f"/{method.containing_service.full_name}/{method.name}"
    kwargs = {
        "request_serializer": request_type.SerializeToString,
        "response_deserializer": response_type.FromString,
    }
    try:
        if method.server_streaming:
            stream = channel.unary_stream(path, **kwargs)(request_type(), metadata=metadata, timeout=timeout)
            next(iter(stream), None)
            stream.cancel()
        else:
            channel.unary_unary(path, **kwargs)(request_type(), metadata=metadata, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, ""
