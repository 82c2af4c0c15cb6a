"""The reference model: a small real sampler behind the OpenAI API (see docs/reference-model.md).

Private: import it through ``orchestrator.reference_model``.
"""
