"""Streamed answers: a finished completion laid out as the server-sent chunks vLLM sends.

Each sampled token gets its own chunk, carrying its share of the reasoning or the content, its
log-prob entry and (with `return_token_ids`) its id; the first chunk carries the role and the
prompt token ids. A tool call
is sent whole, in one chunk after its tokens, as vLLM's tool parsers do once a call is complete.
With `stream_options.include_usage` a last chunk carries the usage. The stream ends `data: [DONE]`.
"""

from __future__ import annotations

import codecs
import copy
from collections.abc import Iterator, Mapping
from typing import Any

from orchestrator.reference_model._model import ChatAnswer
from orchestrator.reference_model._vocabulary import Vocabulary


def _pieces(vocabulary: Vocabulary, token_ids: list[int], limit: int | None) -> list[str]:
    """Each token's share of the decoded text, so the pieces join to exactly the full text."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces, length = [], 0
    for i, token_id in enumerate(token_ids):
        raw = b"" if token_id in vocabulary.special_ids else vocabulary.token_bytes[token_id]
        piece = decoder.decode(raw, final=i == len(token_ids) - 1)
        if limit is not None:
            piece = piece[: max(0, limit - length)]
        length += len(piece)
        pieces.append(piece)
    return pieces


def chat_chunks(answer: ChatAnswer, *, token_ids: bool, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chunks of a chat completion that was generated with token ids: each token's share of
    the reasoning or the content, then the tool calls whole."""
    response = answer.response
    choice = response["choices"][0]
    message = choice["message"]
    ids: list[int] = choice["token_ids"]
    entries = (choice.get("logprobs") or {}).get("content") or [None] * len(ids)
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        body = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        return {**head, "choices": [body]}

    first = chunk({"role": "assistant", "content": ""})
    if token_ids:
        first["prompt_token_ids"] = response["prompt_token_ids"]
    yield first
    for token_id, delta, entry in zip(ids, answer.deltas, entries, strict=True):
        extra: dict[str, Any] = {}
        if entry is not None:
            extra["logprobs"] = {"content": [entry], "refusal": None}
        if token_ids:
            extra["token_ids"] = [token_id]
        yield chunk(dict(delta), **extra)
    calls = message.get("tool_calls") or []
    if calls:
        yield chunk({"tool_calls": [{"index": i, **copy.deepcopy(c)} for i, c in enumerate(calls)]})
    yield chunk({}, finish_reason=choice["finish_reason"])
    if include_usage:
        yield {**head, "choices": [], "usage": response["usage"]}


def completion_chunks(
    vocabulary: Vocabulary, response: Mapping[str, Any], *, token_ids: bool, include_usage: bool
) -> Iterator[dict[str, Any]]:
    """The chunks of a legacy completion that was generated with token ids."""
    choice = response["choices"][0]
    ids: list[int] = choice["token_ids"]
    logprobs = choice.get("logprobs")
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "text_completion"
    for i, (token_id, piece) in enumerate(
        zip(ids, _pieces(vocabulary, ids, len(choice["text"])), strict=True)
    ):
        body: dict[str, Any] = {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
        if logprobs is not None:
            body["logprobs"] = {key: [values[i]] for key, values in logprobs.items()}
        if token_ids:
            body["token_ids"] = [token_id]
            if i == 0:
                body["prompt_token_ids"] = choice["prompt_token_ids"]
        yield {**head, "choices": [body]}
    yield {
        **head,
        "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}],
    }
    if include_usage:
        yield {**head, "choices": [], "usage": response["usage"]}


def generate_chunks(response: Mapping[str, Any], body: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """SGLang's streamed /generate: each chunk holds everything so far (text, output_ids and the
    log-probs), the last one the finish reason."""
    ids: list[int] = response["output_ids"]
    meta = response["meta_info"]
    logprobs = meta.get("output_token_logprobs") if body.get("return_logprob") else None
    for n in range(1, len(ids) + 1):
        chunk_meta = {
            **meta,
            "finish_reason": meta["finish_reason"] if n == len(ids) else None,
            "completion_tokens": n,
        }
        if logprobs is not None:
            chunk_meta["output_token_logprobs"] = logprobs[:n]
        chunk_meta.pop("output_top_logprobs", None)
        yield {"text": "", "output_ids": ids[:n], "meta_info": chunk_meta}
