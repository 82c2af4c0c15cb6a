"""The wire between the orchestrator and its node agents: the generated stubs (`protos.stasis`,
`protos.criu`, made by `protos/generate.py`; never edited by hand) and `protos.shared`, the code
both sides use to speak it. Nothing here imports the orchestrator or the node agent."""
