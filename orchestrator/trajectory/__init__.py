"""The trajectory: every model turn of every episode as a tree in the ledger, how a request is
matched to the turn it replays or continues, and what a trainer takes of it.

`canonical` reduces a request to what makes two requests the same turn; `ledger` records turns
(`turns`) before their answers are delivered, exactly once across preemptions, in SQLite or in
the PostgreSQL store's database (`schema`), each with its edge in the tree (`edges`); `policy`
keeps the policy versions a trainer publishes beside them, `outages` the model server's failures
and `verifications` the rewards; `samples` lays an episode's turns out as training samples, with
each token's staleness, `exports` as per-call records, `trees` as tree samples (a fork's
children's as one set of trees), `forks` shares a fork child's parent's turns with it and `interchange`
as ATIF (`dataset` writes them to Parquet or JSONL). The gateway writes it and the control loop
and API read it; it imports only the state room's databases and the domain.
"""

from orchestrator.trajectory.canonical import CanonicalRequest
from orchestrator.trajectory.edges import Edge
from orchestrator.trajectory.exports import CallRecord, ExportSettings, call_records
from orchestrator.trajectory.forks import ForkOrigin
from orchestrator.trajectory.interchange import atif
from orchestrator.trajectory.ledger import Ledger
from orchestrator.trajectory.policy import PolicyVersions, PublishedPolicy
from orchestrator.trajectory.samples import Sample, samples
from orchestrator.trajectory.trees import TreeSamples, TreeStream, fork_tree_samples, tree_samples
from orchestrator.trajectory.turns import Branch, Lineage, Sampling, Turn
from orchestrator.trajectory.verifications import Verification

__all__ = [
    "Branch",
    "CallRecord",
    "CanonicalRequest",
    "Edge",
    "ExportSettings",
    "ForkOrigin",
    "Ledger",
    "Lineage",
    "PolicyVersions",
    "PublishedPolicy",
    "Sample",
    "Sampling",
    "TreeSamples",
    "TreeStream",
    "Turn",
    "Verification",
    "atif",
    "call_records",
    "fork_tree_samples",
    "samples",
    "tree_samples",
]
