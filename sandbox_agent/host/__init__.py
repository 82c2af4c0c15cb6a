"""The node's kernel, as a sandbox needs it: network namespaces and their veths (over route
netlink), cgroups and the freezer, user namespaces and id-mapped mounts, the overlay root and the
writable layer's disks, the seccomp filter, reading a hostile tree without following its
symlinks, and the one runner for the tools the agent starts (`tools`).

Owns every system call and every command line the agent makes of the host. Imports only the
agent's errors; never a runtime, CRIU, an image or the node.
"""
