"""Images: OCI images fetched from registries and archives (`oci`, through skopeo and umoci,
every blob's digest verified), and the node's cache of unpacked read-only root filesystems keyed
by content digest (`cache`).

Owns what a sandbox's root is made from. Imports the host room and the agent's errors; never a
runtime or the node.
"""
