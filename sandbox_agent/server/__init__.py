"""The agent's faces to the cluster: its gRPC service (`service`: protobuf in, `Node` calls,
protobuf out, errors to status codes), registering with the orchestrator and its heartbeat
(`registration`), joining with a certificate (`joining`), and the forwarder that lets every
sandbox reach the gateway at one address (`forwarder`).

Owns the wire and membership. The top room: it imports the node and every room below it; none
imports it but the agent's entry point and public API.
"""
