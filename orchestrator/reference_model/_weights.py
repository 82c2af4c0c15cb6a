"""The reference model's "weights": seeded logit tables indexed by a hash of the recent context.

logit(token | context) = prior[token] + GAUSSIAN[table[bucket(context)][token]]

``prior`` gives words a higher unigram score than single characters so free
text reads like (meaningless) prose. ``table`` holds one random byte per
(bucket, token); a byte indexes a fixed quantile table of a normal
distribution, which keeps the tables small (about 700 KB) and start-up under
a few milliseconds. Everything derives from (seed, policy version), so a new
policy version is a different model.
"""

from __future__ import annotations

import hashlib
import random
import statistics
from collections.abc import Sequence

from orchestrator.reference_model._vocabulary import Vocabulary

BUCKETS = 1024
CONTEXT_WINDOW = 3
"""How many trailing tokens, besides the prompt digest, select the logit row."""
CONTEXT_SCALE = 1.5
"""Standard deviation of the context-dependent part of a logit, in nats."""

_MASK64 = (1 << 64) - 1
_NORMAL = statistics.NormalDist(0.0, CONTEXT_SCALE)
GAUSSIAN: tuple[float, ...] = tuple(_NORMAL.inv_cdf((b + 0.5) / 256) for b in range(256))


def mix(h: int, value: int) -> int:
    """One step of a 64-bit hash combine (boost's hash_combine, widened)."""
    return (h ^ ((value & _MASK64) + 0x9E3779B97F4A7C15 + ((h << 6) & _MASK64) + (h >> 2))) & _MASK64


def _prior(token: str, token_id: int, special: frozenset[int]) -> float:
    if token_id in special:
        return 0.0
    if len(token) >= 3 and token[0] == " " and token[1:].isalpha():
        return 1.5
    if len(token) > 1:
        return 0.0
    return -0.5 if token.isalnum() or token == " " else -1.5


class PolicyWeights:
    """Immutable logit tables for one (seed, policy version)."""

    def __init__(self, vocabulary: Vocabulary, seed: int, policy_version: str) -> None:
        self.vocabulary = vocabulary
        self.seed = seed
        self.policy_version = policy_version
        material = hashlib.sha256(f"{seed}\0{policy_version}".encode()).digest()
        self.salt = int.from_bytes(material[:8], "little")
        rng = random.Random(material)
        self.prior: tuple[float, ...] = tuple(
            _prior(tok, i, vocabulary.special_ids) + rng.gauss(0.0, 0.5)
            for i, tok in enumerate(vocabulary.tokens)
        )
        self.table: tuple[bytes, ...] = tuple(rng.randbytes(len(vocabulary)) for _ in range(BUCKETS))

    def context_key(self, prompt_digest: int, context: Sequence[int]) -> int:
        """The bucket that selects the logit row for the next token after context."""
        h = mix(self.salt, prompt_digest)
        for token_id in context[-CONTEXT_WINDOW:]:
            h = mix(h, token_id)
        return h % BUCKETS

    def logit(self, bucket: int, token_id: int) -> float:
        """The raw logit of one token in the given context bucket."""
        return self.prior[token_id] + GAUSSIAN[self.table[bucket][token_id]]

    def logits(self, bucket: int, token_ids: Sequence[int]) -> list[float]:
        """Raw logits of the given tokens in the given context bucket."""
        row = self.table[bucket]
        prior = self.prior
        return [prior[t] + GAUSSIAN[row[t]] for t in token_ids]
