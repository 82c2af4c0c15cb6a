"""The reference model: a small, exact, seeded sampler behind an OpenAI-compatible API.

It stands in for vLLM/SGLang in tests and in `stasis up`: a language model over
tokens (its next-token distribution a function of the token prefix, the policy
version and the sampling parameters alone), a fixed vocabulary shipped as a
Hugging Face tokenizer with Qwen3's chat template, grammar-valid tool calls, and
log-probs that are exactly those of the distribution each token was sampled
from, which `ReferenceModel.logprobs` (a teacher-forced pass) reproduces. See
docs/reference-model.md.

Run it with ``python -m orchestrator.reference_model --port 0``, or in-process::

    server = ReferenceModelServer(ReferenceModelSettings(seed=0)).start()
    ...  # OpenAI(base_url=server.url, api_key="x")
    server.stop()
"""

from __future__ import annotations

from orchestrator.reference_model._model import ReferenceModel
from orchestrator.reference_model._protocol import ApiError
from orchestrator.reference_model._sampling import StepDistribution
from orchestrator.reference_model._server import POLICY_VERSION_HEADER, ReferenceModelServer
from orchestrator.reference_model._settings import ReferenceModelSettings
from orchestrator.reference_model._vocabulary import (
    TOKENIZER_DIR,
    VOCABULARY,
    Vocabulary,
    decode,
    tokenize,
    write_tokenizer_dir,
)

__all__ = [
    "POLICY_VERSION_HEADER",
    "TOKENIZER_DIR",
    "VOCABULARY",
    "ApiError",
    "ReferenceModel",
    "ReferenceModelServer",
    "ReferenceModelSettings",
    "StepDistribution",
    "Vocabulary",
    "decode",
    "tokenize",
    "write_tokenizer_dir",
]
