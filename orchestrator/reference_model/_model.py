"""The reference model: request bodies in, sampled responses out, and the teacher-forced pass a
trainer would make over the same tokens."""

from __future__ import annotations

import codecs
import hashlib
import random
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.reference_model._decoding import FREE, Constraint, generate
from orchestrator.reference_model._grammar import CallGrammar, TrieCache
from orchestrator.reference_model._protocol import (
    ChatRequest,
    CompletionRequest,
    invalid,
    parse_chat,
    parse_completion,
    parse_generate,
)
from orchestrator.reference_model._sampling import Generation, SampledToken, SamplingParams, StepDistribution
from orchestrator.reference_model._settings import ReferenceModelSettings
from orchestrator.reference_model._template import render_chat
from orchestrator.reference_model._token_model import Behaviour, TokenModel, digest
from orchestrator.reference_model._vocabulary import VOCABULARY, Vocabulary
from orchestrator.reference_model._weights import PolicyWeights

MAX_MODEL_LEN = 1 << 20
"""What /tokenize reports as the context length: the reference model has no fixed window."""


@dataclass(frozen=True)
class ChatAnswer:
    """A chat completion, and what each sampled token adds to the message when streamed."""

    response: dict[str, Any]
    deltas: list[dict[str, str]]
    """Per sampled token: {"content": piece}, {"reasoning_content": piece} or {} (markup, calls)."""


class ReferenceModel:
    """A small real sampler behind the OpenAI and SGLang APIs: fixed vocabulary, seeded weights,
    Qwen3's chat format, grammar-valid tool calls."""

    def __init__(self, settings: ReferenceModelSettings | None = None) -> None:
        self.settings = settings or ReferenceModelSettings()
        self.vocabulary: Vocabulary = VOCABULARY
        s = self.settings
        self._behaviour = Behaviour(
            s.mean_tool_turns, s.mean_answer_tokens, s.think_probability, s.mean_think_tokens
        )
        self._tries = TrieCache()
        self._models: dict[str, TokenModel] = {}
        self._models_lock = threading.Lock()
        self._policy_version = s.policy_version
        self._rng = random.Random(s.seed)
        self._rng_lock = threading.Lock()

    @property
    def policy_version(self) -> str:
        """The policy version new requests are sampled under."""
        return self._policy_version

    def set_policy_version(self, policy_version: str) -> None:
        """Switch to new weights, as a trainer's weight update would; requests in flight finish on the old ones."""
        self._policy_version = policy_version

    def token_model(self, policy_version: str | None = None) -> TokenModel:
        """The model over tokens under a policy version (the current one by default)."""
        version = policy_version or self._policy_version
        with self._models_lock:
            model = self._models.get(version)
            if model is None:
                weights = PolicyWeights(self.vocabulary, self.settings.seed, version)
                model = self._models[version] = TokenModel(weights, self._behaviour, self._tries)
            return model

    def _request_rng(self, seed: int | None) -> random.Random:
        if seed is not None:
            return random.Random(seed)
        with self._rng_lock:
            return random.Random(self._rng.getrandbits(64))

    def _sample(
        self, model: TokenModel, prompt_ids: Sequence[int], params: SamplingParams, seed: int | None,
        constraint: Constraint = FREE, top_logprobs: int = 0,
    ) -> Generation:  # fmt: skip
        raw = SamplingParams(max_tokens=params.max_tokens) if self.settings.logprobs_mode == "raw" else None
        generation, _ = generate(
            model, prompt_ids, params, self._request_rng(seed),
            constraint=constraint, top_logprobs=top_logprobs, report=raw,
        )  # fmt: skip
        return generation

    def logprobs(
        self,
        token_ids: Sequence[int],
        policy_version: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> list[float | None]:
        """A trainer's teacher-forced pass: the log-prob of every token given the tokens before it,
        under the distribution it is sampled from with these settings (None for the first token,
        which has nothing before it). Sampled tokens score exactly what sampling reported."""
        params = SamplingParams(temperature=temperature, top_p=top_p)
        return self.token_model(policy_version).logprobs(token_ids, params)

    # -- chat ----------------------------------------------------------------------------------------------

    @staticmethod
    def _constraint(request: ChatRequest) -> Constraint:
        choice = request.tool_choice
        return Constraint(
            tools=frozenset([choice.removeprefix("function:")]) if choice.startswith("function:") else None,
            require_call=choice == "required" or choice.startswith("function:"),
            forbid_calls=choice == "none",
            parallel_calls=request.parallel_tool_calls,
        )

    def chat_prompt_ids(self, body: Mapping[str, Any]) -> list[int]:
        """The prompt token ids the chat template gives this request body."""
        request = parse_chat(body, self.settings.default_max_tokens)
        return self._prompt(request)

    def _prompt(self, request: ChatRequest) -> list[int]:
        return render_chat(self.vocabulary, request.messages, request.tools, **request.template_options)

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
        return self.chat_answer(body).response

    def chat_answer(self, body: Mapping[str, Any]) -> ChatAnswer:
        """A chat completion with what each token adds to the message (for streaming)."""
        request = parse_chat(body, self.settings.default_max_tokens)
        model = self.token_model()
        prompt_ids = self._prompt(request)
        constraint = self._constraint(request)
        top = request.top_logprobs if request.logprobs else 0
        generation = self._sample(model, prompt_ids, request.params, request.seed, constraint, top)
        context = model.context(prompt_ids)
        message, deltas = self._chat_message(model, generation, context.grammar, prompt_ids)
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
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
            "finish_reason": "tool_calls" if message.get("tool_calls") else generation.finish_reason,
        }
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "system_fingerprint": model.weights.policy_version,
            "choices": [choice],
            "usage": self._usage(prompt_ids, generation),
        }
        if request.return_token_ids:
            choice["token_ids"] = generation.token_ids
            response["prompt_token_ids"] = prompt_ids
        return ChatAnswer(response, deltas)

    def _chat_message(
        self,
        model: TokenModel,
        generation: Generation,
        grammar: CallGrammar | None,
        prompt_ids: Sequence[int],
    ) -> tuple[dict[str, Any], list[dict[str, str]]]:
        """The assistant message the sampled ids spell (reasoning, then an answer or calls), and
        each token's share of it."""
        ids = generation.token_ids
        deltas: list[dict[str, str]] = [{} for _ in ids]
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        rest = 0
        if ids[:1] == [model.think_open]:
            close = ids.index(model.think_close) if model.think_close in ids else len(ids)
            body = range(2, close - 1 if close < len(ids) else len(ids))
            message["reasoning_content"] = self._spread(ids, body, deltas, "reasoning_content")
            rest = close + 2 if close < len(ids) else len(ids)
        answer = ids[rest:]
        if answer[:1] != [model.call_open]:
            limit = generation.stop_at
            content = self._spread(ids, range(rest, len(ids)), deltas, "content", limit, skip_special=True)
            message["content"] = content if rest < len(ids) else None
            return message, deltas
        segments: list[list[int]] = []
        complete = True
        for token_id in answer:
            if token_id == model.call_open:
                segments.append([])
                complete = False
            elif token_id == model.call_close:
                complete = True
            elif not complete:
                segments[-1].append(token_id)
        if not complete or grammar is None:
            # Cut off inside a call: no valid call to report, so the raw text goes back as content.
            message["content"] = self._spread(ids, range(rest, len(ids)), deltas, "content")
            return message, deltas
        calls = []
        prompt_digest = digest(prompt_ids)
        for index, segment in enumerate(segments):
            text = self.vocabulary.decode(segment)
            pattern = grammar.pattern_of(text)
            call_hash = hashlib.blake2b(f"{prompt_digest}:{index}:{ids}".encode(), digest_size=12).hexdigest()
            calls.append(
                {
                    "id": f"call_{call_hash}",
                    "type": "function",
                    "function": {"name": pattern.tool_name, "arguments": pattern.arguments(text)},
                }
            )
        message["tool_calls"] = calls
        return message, deltas

    def _spread(
        self,
        ids: Sequence[int],
        positions: range,
        deltas: list[dict[str, str]],
        field: str,
        limit: int | None = None,
        *,
        skip_special: bool = False,
    ) -> str:
        """Decode ids[positions] (up to `limit` characters), noting each token's piece in `deltas`."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = ""
        for n, i in enumerate(positions):
            raw = (
                b""
                if skip_special and ids[i] in self.vocabulary.special_ids
                else self.vocabulary.token_bytes[ids[i]]
            )
            piece = decoder.decode(raw, final=n == len(positions) - 1)
            if limit is not None:
                piece = piece[: max(0, limit - len(text))]
            text += piece
            deltas[i] = {field: piece}
        return text

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

        Uses the body's temperature, top_p and tool_choice exactly as a request would; raises
        ValueError if token_ids leave the response grammar.
        """
        request = parse_chat(body, self.settings.default_max_tokens)
        model = self.token_model(policy_version)
        return self._score(model, self._prompt(request), request.params, token_ids, self._constraint(request))

    @staticmethod
    def _score(
        model: TokenModel, prompt_ids: Sequence[int], params: SamplingParams, token_ids: Sequence[int],
        constraint: Constraint = FREE,
    ) -> list[StepDistribution]:  # fmt: skip
        decoder = model.decoder(prompt_ids, constraint)
        out = []
        for token_id in token_ids:
            out.append(decoder.distribution(params))
            decoder.advance(token_id)
        return out

    # -- legacy completions and SGLang's /generate ------------------------------------------------------

    def _completion_prompt(self, request: CompletionRequest) -> list[int]:
        if isinstance(request.prompt, str):
            return self.vocabulary.tokenize(request.prompt)
        return list(request.prompt)

    def completion(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer a legacy /v1/completions body (a text prompt, or token ids as vLLM takes them);
        raises ApiError for invalid requests."""
        request = parse_completion(body, self.settings.default_max_tokens, len(self.vocabulary))
        model = self.token_model()
        prompt_ids = self._completion_prompt(request)
        generation = self._sample(
            model, prompt_ids, request.params, request.seed, top_logprobs=request.logprobs or 0
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
            "system_fingerprint": model.weights.policy_version,
            "choices": [choice],
            "usage": self._usage(prompt_ids, generation),
        }

    def generate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer an SGLang /generate body: `input_ids` in; `output_ids`, `text` and `meta_info`
        (finish reason, counts, `output_token_logprobs` as [logprob, id, null]) out."""
        request = parse_generate(body, self.settings.default_max_tokens, len(self.vocabulary))
        model = self.token_model()
        generation = self._sample(
            model, request.input_ids, request.params, request.seed, top_logprobs=request.top_logprobs
        )
        ids = generation.token_ids
        finish: dict[str, Any] = (
            {"type": "length", "length": len(ids)}
            if generation.finish_reason == "length"
            else {"type": "stop", "matched": ids[-1]}
        )
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(request.input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": model.weights.policy_version,
        }
        if request.return_logprob:
            meta["output_token_logprobs"] = [[t.logprob, t.token_id, None] for t in generation.tokens]
            if request.top_logprobs:
                meta["output_top_logprobs"] = [[[lp, i, None] for i, lp in t.top] for t in generation.tokens]
        return {"text": self.vocabulary.decode(ids, skip_special=True), "output_ids": ids, "meta_info": meta}

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
        model = self.token_model(policy_version)
        return self._score(model, self._completion_prompt(request), request.params, token_ids)
