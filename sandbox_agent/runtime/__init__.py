"""Sandbox runtimes behind one interface (`backend.Backend`): runc over an overlay root (`runc`,
the default), or a Docker Engine in experimental mode (`docker_backend`); and what a sandbox
runs, its spec laid over its image's config (`launch`).

A backend starts, freezes, thaws, kills and removes containers, and says what it can
(`user_namespaces`, `runs_verifiers`); its dumps and restores are its `checkpoints`
(`backend.Checkpoints`). For runc those live beside it: its bundle (`bundle`), its root
filesystem (`rootfs`) and its checkpoints, which ask CRIU's core for a dump or a restore
(`runc_criu`). Imports CRIU, images, the host room and the agent's records; never the node or
the server. Only `docker_backend` may import the Docker client.
"""
