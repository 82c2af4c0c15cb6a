"""The shared room: what the orchestrator and the node agent both use, and nothing either owns.

It owns the generic codec between protobuf messages and records (`wire`), the cluster's TLS and
PKI (`tls`, `pki`), the admission interceptor (`admission`), the gRPC status of each snapshot
error and the handler wrapper that applies it (`status`), streaming blocking work (`relay`),
the one host:port parser (`address`), the one socket pump (`pump`) and the bounds of a
sandbox's resource limits (`resources`).

Anyone may import it: `orchestrator`, `sandbox_agent`, the tests, benchmarks and examples. It
imports nothing from `orchestrator` or `sandbox_agent`, and of `snapshots` only the error types
`status` maps (contracts in pyproject.toml). Only `wire` and the modules that serve gRPC handle
the generated stubs or `grpc`.
"""
