"""The reference model: OpenAI request bodies in, sampled responses (and replayed distributions) out."""

from __future__ import annotations

import hashlib
import random
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.reference_model._decoding import (
    Generation,
    ResponseShape,
    SampledToken,
    StepDistribution,
    generate,
    score,
)
from orchestrator.reference_model._grammar import CallGrammar, TrieCache, call_pattern
from orchestrator.reference_model._protocol import (
    ChatRequest,
    CompletionRequest,
    invalid,
    parse_chat,
    parse_completion,
)
from orchestrator.reference_model._settings import ReferenceModelSettings
from orchestrator.reference_model._template import render_chat
from orchestrator.reference_model._vocabulary import (
    END_OF_TEXT,
    IM_END,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    VOCABULARY,
    Vocabulary,
)
from orchestrator.reference_model._weights import PolicyWeights, digest

MAX_MODEL_LEN = 1 << 20
"""What /tokenize reports as the context length: the reference model has no fixed window."""


class ReferenceModel:
    """A small real sampler behind the OpenAI API: fixed vocabulary, seeded weights, grammar-valid tool calls."""

    def __init__(self, settings: ReferenceModelSettings | None = None) -> None:
        self.settings = settings or ReferenceModelSettings()
        self.vocabulary: Vocabulary = VOCABULARY
        self._weights = PolicyWeights(self.vocabulary, self.settings.seed, self.settings.policy_version)
        self._rng = random.Random(self.settings.seed)
        self._rng_lock = threading.Lock()
        self._tries = TrieCache()
        self._im_end = self.vocabulary.id_of(IM_END)
        self._end_of_text = self.vocabulary.id_of(END_OF_TEXT)
        self._call_open = self.vocabulary.id_of(TOOL_CALL_OPEN)
        self._call_close = self.vocabulary.id_of(TOOL_CALL_CLOSE)

    @property
    def policy_version(self) -> str:
        """The policy version new requests are sampled under."""
        return self._weights.policy_version

    def set_policy_version(self, policy_version: str) -> None:
        """Switch to new weights, as a trainer's weight update would; requests in flight finish on the old ones."""
        self._weights = PolicyWeights(self.vocabulary, self.settings.seed, policy_version)

    def _weights_for(self, policy_version: str | None) -> PolicyWeights:
        weights = self._weights
        if policy_version is None or policy_version == weights.policy_version:
            return weights
        return PolicyWeights(self.vocabulary, self.settings.seed, policy_version)

    def _request_rng(self, seed: int | None) -> random.Random:
        if seed is not None:
            return random.Random(seed)
        with self._rng_lock:
            return random.Random(self._rng.getrandbits(64))

    # -- chat ----------------------------------------------------------------------------------------------

    def _chat_shape(self, request: ChatRequest) -> ResponseShape:
        offered = request.tools
        if request.tool_choice == "none":
            offered = ()
        elif request.tool_choice.startswith("function:"):
            offered = tuple(t for t in offered if t.name == request.tool_choice.removeprefix("function:"))
        grammar = (
            CallGrammar([call_pattern(t.name, t.parameters, self._tries) for t in offered], self.vocabulary)
            if offered
            else None
        )
        return ResponseShape(
            end_id=self._im_end,
            grammar=grammar,
            may_answer=request.tool_choice in ("auto", "none"),
            parallel_calls=request.parallel_tool_calls,
            tool_results=sum(1 for m in request.messages if m.role == "tool"),
            mean_tool_turns=self.settings.mean_tool_turns,
            mean_answer_tokens=self.settings.mean_answer_tokens,
        )

    def chat_prompt_ids(self, body: Mapping[str, Any]) -> list[int]:
        """The prompt token ids the chat template gives this request body."""
        request = parse_chat(body, self.settings.default_max_tokens)
        return render_chat(self.vocabulary, request.messages, request.tools)

    def tokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer a /tokenize body, as vLLM does: the prompt ids of `messages` (with `tools`) or `prompt`."""
        if "messages" in body:
            ids = self.chat_prompt_ids({"model": self.settings.model_name, **body})
        elif isinstance(body.get("prompt"), str):
            ids = self.vocabulary.tokenize(body["prompt"])
        else:
            raise invalid("messages", "give messages (a chat) or prompt (a string)")
        return {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids}

    def chat_completion(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer a /v1/chat/completions body; raises ApiError for invalid requests."""
        request = parse_chat(body, self.settings.default_max_tokens)
        weights = self._weights
        prompt_ids = render_chat(self.vocabulary, request.messages, request.tools)
        shape = self._chat_shape(request)
        generation = generate(
            weights,
            prompt_ids,
            shape,
            request.params,
            self._request_rng(request.seed),
            request.top_logprobs if request.logprobs else 0,
        )
        choice: dict[str, Any] = {
            "index": 0,
            "message": self._chat_message(generation, shape, prompt_ids),
            "logprobs": (
                {
                    "content": [
                        self._logprob_entry(t, request.return_tokens_as_token_ids) for t in generation.tokens
                    ],
                    "refusal": None,
                }
                if request.logprobs
                else None
            ),
            "finish_reason": generation.finish_reason,
        }
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "system_fingerprint": weights.policy_version,
            "choices": [choice],
            "usage": self._usage(prompt_ids, generation),
        }
        if request.return_token_ids:
            choice["token_ids"] = generation.token_ids
            response["prompt_token_ids"] = prompt_ids
        return response

    def _chat_message(
        self, generation: Generation, shape: ResponseShape, prompt_ids: Sequence[int]
    ) -> dict[str, Any]:
        ids = generation.token_ids
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if not ids or ids[0] != self._call_open:
            content = self.vocabulary.decode(ids, skip_special=True)
            message["content"] = content if generation.stop_at is None else content[: generation.stop_at]
            return message
        segments: list[list[int]] = []
        complete = True
        for token_id in ids:
            if token_id == self._call_open:
                segments.append([])
                complete = False
            elif token_id == self._call_close:
                complete = True
            elif not complete:
                segments[-1].append(token_id)
        if not complete:
            # Cut off inside a call: no valid call to report, so the raw text goes back as content.
            message["content"] = self.vocabulary.decode(ids)
            return message
        assert shape.grammar is not None
        prompt_digest = digest(prompt_ids)
        calls = []
        for index, segment in enumerate(segments):
            text = self.vocabulary.decode(segment)
            pattern = shape.grammar.pattern_of(text)
            # The arguments are the generated characters between the call prefix and the closing brace.
            arguments = text[len(pattern.prefix) : -1]
            call_hash = hashlib.blake2b(f"{prompt_digest}:{index}:{ids}".encode(), digest_size=12).hexdigest()
            calls.append(
                {
                    "id": f"call_{call_hash}",
                    "type": "function",
                    "function": {"name": pattern.tool_name, "arguments": arguments},
                }
            )
        message["tool_calls"] = calls
        return message

    def _token_label(self, token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else self.vocabulary.tokens[token_id]

    def _logprob_entry(self, token: SampledToken, as_ids: bool) -> dict[str, Any]:
        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            return {
                "token": self._token_label(token_id, as_ids),
                "logprob": logprob,
                "bytes": list(self.vocabulary.token_bytes[token_id]),
            }

        out = entry(token.token_id, token.logprob)
        out["top_logprobs"] = [entry(t, lp) for t, lp in token.top]
        return out

    @staticmethod
    def _usage(prompt_ids: Sequence[int], generation: Generation) -> dict[str, int]:
        prompt, completion = len(prompt_ids), len(generation.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def score_chat(
        self, body: Mapping[str, Any], token_ids: Sequence[int], policy_version: str | None = None
    ) -> list[StepDistribution]:
        """The distribution each of token_ids was drawn from, for this chat body, under a policy version.

        Uses the body's temperature, top_p, tools and tool_choice exactly as a
        request would; raises ValueError if token_ids leave the response grammar.
        """
        request = parse_chat(body, self.settings.default_max_tokens)
        prompt_ids = render_chat(self.vocabulary, request.messages, request.tools)
        weights = self._weights_for(policy_version)
        return score(weights, prompt_ids, self._chat_shape(request), request.params, token_ids)

    # -- legacy completions --------------------------------------------------------------------------------

    def _completion_shape(self) -> ResponseShape:
        return ResponseShape(end_id=self._end_of_text, mean_answer_tokens=self.settings.mean_answer_tokens)

    def _completion_prompt(self, request: CompletionRequest) -> list[int]:
        if isinstance(request.prompt, str):
            return self.vocabulary.tokenize(request.prompt)
        return list(request.prompt)

    def completion(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer a legacy /v1/completions body; raises ApiError for invalid requests."""
        request = parse_completion(body, self.settings.default_max_tokens, len(self.vocabulary))
        weights = self._weights
        prompt_ids = self._completion_prompt(request)
        generation = generate(
            weights,
            prompt_ids,
            self._completion_shape(),
            request.params,
            self._request_rng(request.seed),
            request.logprobs or 0,
        )
        text = self.vocabulary.decode(generation.token_ids, skip_special=True)
        if generation.stop_at is not None:
            text = text[: generation.stop_at]
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None if request.logprobs is None else self._legacy_logprobs(generation, request),
            "finish_reason": generation.finish_reason,
        }
        if request.return_token_ids:
            choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = generation.token_ids
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": request.model,
            "system_fingerprint": weights.policy_version,
            "choices": [choice],
            "usage": self._usage(prompt_ids, generation),
        }

    def _legacy_logprobs(self, generation: Generation, request: CompletionRequest) -> dict[str, Any]:
        as_ids = request.return_tokens_as_token_ids
        offsets, offset = [], 0
        for token in generation.tokens:
            offsets.append(offset)
            if token.token_id not in self.vocabulary.special_ids:
                offset += len(self.vocabulary.decode([token.token_id]))
        return {
            "tokens": [self._token_label(t.token_id, as_ids) for t in generation.tokens],
            "token_logprobs": [t.logprob for t in generation.tokens],
            "top_logprobs": [
                {self._token_label(i, as_ids): lp for i, lp in t.top} for t in generation.tokens
            ],
            "text_offset": offsets,
        }

    def score_completion(
        self, body: Mapping[str, Any], token_ids: Sequence[int], policy_version: str | None = None
    ) -> list[StepDistribution]:
        """The distribution each of token_ids was drawn from, for this legacy completion body."""
        request = parse_completion(body, self.settings.default_max_tokens, len(self.vocabulary))
        weights = self._weights_for(policy_version)
        return score(
            weights, self._completion_prompt(request), self._completion_shape(), request.params, token_ids
        )
