"""CRIU: one core (`core.Criu`) with one method per action, `dump`, `restore` and `lazy_pages`,
which builds every request and option CRIU is sent and sends it over CRIU's RPC (`swrk`); what it
measured of its own dump (`stats`); its images (`images`, `pagemap`); and the lazy restore
(`lazy`): its lazy-pages daemon, and the page server that answers it from the snapshot store,
every chunk verified as it arrives, under the host's userfaultfd grant (`userfaultfd`).

Owns the agent's side of CRIU's protocols. Imports CRIU's protobufs, the checkpoint directory's
layout, the snapshot store's alignment types, the host room and the agent's errors; never a
runtime or the node.
"""
