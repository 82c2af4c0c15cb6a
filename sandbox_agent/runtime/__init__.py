"""Sandbox runtimes behind one interface (`backend.Backend`): runc over an overlay root with CRIU
over its RPC (`runc`, the default), or a Docker Engine in experimental mode (`docker_backend`);
and what a sandbox runs, its spec laid over its image's config (`launch`).

Owns starting, freezing, dumping, restoring and removing a sandbox's processes. Imports CRIU,
images, the host room and the agent's records; never the node or the server. Only
`docker_backend` may import the Docker client.
"""
