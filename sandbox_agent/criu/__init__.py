"""CRIU: one call over its RPC (`swrk`), what it measured of its own dump (`stats`), and the lazy
restore (`lazy`): its lazy-pages daemon, and the page server that answers it from the snapshot
store, every chunk verified as it arrives.

Owns the agent's side of CRIU's protocols. Imports CRIU's protobufs, the checkpoint directory's
layout, the snapshot store's alignment types and the agent's errors; never a runtime or the node.
"""
