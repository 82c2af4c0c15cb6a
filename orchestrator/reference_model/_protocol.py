"""OpenAI request validation: JSON bodies in, typed requests out, or an error that names the field."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.reference_model._grammar import TOOL_NAME
from orchestrator.reference_model._sampling import SamplingParams

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4


class ApiError(Exception):
    """A request the server refuses, rendered as an OpenAI-style error object."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


def invalid(param: str, message: str) -> ApiError:
    """A 400 for one field, its name leading the message so logs show it too."""
    return ApiError(400, f"{param}: {message}", param)


@dataclass(frozen=True)
class ToolCallRecord:
    """A call in an assistant message of the conversation; arguments are kept verbatim."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One conversation message, with content flattened to text."""

    role: str
    content: str
    tool_calls: tuple[ToolCallRecord, ...] = ()
    reasoning: str | None = None
    """An assistant message's reasoning (`reasoning_content`), which the template may show."""


@dataclass(frozen=True)
class FunctionTool:
    """A function tool offered to the model."""

    name: str
    description: str | None
    parameters: Mapping[str, Any]
    declaration: Mapping[str, Any]
    """The tool object as the request gave it, which the template lists verbatim."""


@dataclass(frozen=True)
class ChatRequest:
    """A validated /v1/chat/completions request."""

    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[FunctionTool, ...]
    tool_choice: str
    """"auto", "none", "required", or "function:<name>" for a named tool."""
    parallel_tool_calls: bool
    params: SamplingParams
    seed: int | None
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    template_options: Mapping[str, Any]
    """`chat_template_kwargs` the template understands (`enable_thinking`)."""


@dataclass(frozen=True)
class CompletionRequest:
    """A validated legacy /v1/completions request."""

    model: str
    prompt: str | tuple[int, ...]
    params: SamplingParams
    seed: int | None
    logprobs: int | None
    return_token_ids: bool
    return_tokens_as_token_ids: bool


def _int(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(key, f"must be an integer, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid(key, f"must be {bound}, got {value}")
    return value


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(key, "must be a finite number")
    if not low <= value <= high:
        raise invalid(key, f"must be between {low} and {high}, got {value}")
    return float(value)


def _bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(key, "must be a boolean")
    return value


def _common(
    body: Mapping[str, Any], default_max_tokens: int, *, chat: bool
) -> tuple[str, SamplingParams, int | None]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "is required and must be a non-empty string")
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise invalid("n", "only n=1 is supported")
    if _int(body, "best_of", 1) not in (None, 1):
        raise invalid("best_of", "only best_of=1 is supported")
    for key in ("presence_penalty", "frequency_penalty"):
        if _number(body, key, -2.0, 2.0) not in (None, 0.0):
            raise invalid(key, "penalties are not supported (they would change the reported distribution)")
    if body.get("logit_bias"):
        raise invalid("logit_bias", "logit_bias is not supported")
    if body.get("echo"):
        raise invalid("echo", "echo is not supported")
    max_tokens = _int(body, "max_tokens", 1)
    if chat:
        max_tokens = _int(body, "max_completion_tokens", 1) or max_tokens
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise invalid("top_p", "must be greater than 0")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif (
        isinstance(stop, list)
        and all(isinstance(s, str) and s for s in stop)
        and len(stop) <= MAX_STOP_STRINGS
    ):
        stops = tuple(stop)
    else:
        raise invalid("stop", f"must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise invalid("seed", "must be an integer")
    params = SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        max_tokens=max_tokens or default_max_tokens,
        stop=stops,
        stop_token_ids=_token_ids(body.get("stop_token_ids"), "stop_token_ids"),
    )
    return model, params, seed


def _token_ids(value: Any, param: str, vocabulary_size: int | None = None) -> tuple[int, ...]:
    """A list of token ids (none if absent)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise invalid(param, "must be a list of token ids")
    if vocabulary_size is not None and not all(0 <= t < vocabulary_size for t in value):
        raise invalid(param, f"token ids must lie in [0, {vocabulary_size})")
    return tuple(value)


def _content(value: Any, param: str, *, optional: bool = False) -> str:
    if value is None and optional:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise invalid(
                    f"{param}[{i}]", "only text content parts ({type: text, text: ...}) are supported"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(param, "must be a string or a list of text parts")


def _tool_calls(value: Any, param: str) -> tuple[ToolCallRecord, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid(param, "must be a list")
    calls = []
    for i, call in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(call, Mapping):
            raise invalid(where, "must be an object")
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, Mapping):
            raise invalid(where, "must be {type: function, function: {name, arguments}}")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise invalid(f"{where}.function.name", "must be a non-empty string")
        if not isinstance(arguments, str):
            raise invalid(f"{where}.function.arguments", "must be a string (the JSON text as generated)")
        call_id = call.get("id")
        calls.append(ToolCallRecord(call_id if isinstance(call_id, str) else "", name, arguments))
    return tuple(calls)


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", "is required and must be a non-empty list")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise invalid(where, "must be an object")
        role = message.get("role")
        if role in ("system", "developer", "user"):
            out.append(
                ChatMessage(
                    "system" if role == "developer" else role,
                    _content(message.get("content"), f"{where}.content"),
                )
            )
        elif role == "assistant":
            calls = _tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
            reasoning = message.get("reasoning_content", message.get("reasoning"))
            if reasoning is not None and not isinstance(reasoning, str):
                raise invalid(f"{where}.reasoning_content", "must be a string")
            content = _content(message.get("content"), f"{where}.content", optional=True)
            out.append(ChatMessage("assistant", content, calls, reasoning))
        elif role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise invalid(f"{where}.tool_call_id", "is required for tool messages")
            out.append(ChatMessage("tool", _content(message.get("content"), f"{where}.content")))
        else:
            raise invalid(
                f"{where}.role", f"must be system, developer, user, assistant or tool, got {role!r}"
            )
    return tuple(out)


def _tools(value: Any) -> tuple[FunctionTool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("tools", "must be a list")
    tools: list[FunctionTool] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or not isinstance(tool.get("function"), Mapping)
        ):
            raise invalid(where, "must be {type: function, function: {...}}")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise invalid(f"{where}.function.name", "must match ^[a-zA-Z0-9_-]{1,64}$")
        if any(t.name == name for t in tools):
            raise invalid(f"{where}.function.name", f"duplicate tool name {name!r}")
        parameters = function.get("parameters", {})
        if not isinstance(parameters, Mapping):
            raise invalid(f"{where}.function.parameters", "must be a JSON schema object")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid(f"{where}.function.description", "must be a string")
        tools.append(FunctionTool(name, description, parameters, tool))
    return tuple(tools)


def _tool_choice(value: Any, tools: tuple[FunctionTool, ...]) -> str:
    if value is None:
        return "auto" if tools else "none"
    if value in ("auto", "none", "required"):
        if value == "required" and not tools:
            raise invalid("tool_choice", "'required' needs at least one tool")
        return str(value)
    if (
        isinstance(value, Mapping)
        and value.get("type") == "function"
        and isinstance(value.get("function"), Mapping)
    ):
        name = value["function"].get("name")
        if not any(t.name == name for t in tools):
            raise invalid("tool_choice", f"names a tool that is not offered: {name!r}")
        return f"function:{name}"
    raise invalid("tool_choice", "must be auto, none, required or {type: function, function: {name}}")


def parse_chat(body: Mapping[str, Any], default_max_tokens: int) -> ChatRequest:
    """Validate a chat completion request body."""
    model, params, seed = _common(body, default_max_tokens, chat=True)
    messages = _messages(body.get("messages"))
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    logprobs = _bool(body, "logprobs", False)
    top_logprobs = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise invalid("top_logprobs", "needs logprobs=true")
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type", "text") != "text":
        raise invalid("response_format", "only type=text is supported")
    options = body.get("chat_template_kwargs") or {}
    if not isinstance(options, Mapping) or set(options) - {"enable_thinking"}:
        raise invalid("chat_template_kwargs", "only {enable_thinking: true|false} is understood")
    if not isinstance(options.get("enable_thinking", True), bool):
        raise invalid("chat_template_kwargs", "enable_thinking must be a boolean")
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=_bool(body, "parallel_tool_calls", True),
        params=params,
        seed=seed,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        return_token_ids=_bool(body, "return_token_ids", False),
        return_tokens_as_token_ids=_bool(body, "return_tokens_as_token_ids", False),
        template_options=dict(options),
    )


def parse_completion(
    body: Mapping[str, Any], default_max_tokens: int, vocabulary_size: int
) -> CompletionRequest:
    """Validate a legacy completion request body (OpenAI's default max_tokens of 16 applies)."""
    model, params, seed = _common(body, default_max_tokens, chat=False)
    if body.get("max_tokens") is None:
        params = dataclasses.replace(params, max_tokens=16)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt:
            raise invalid("prompt", "a token-id prompt must hold at least one id")
        prompt = _token_ids(prompt, "prompt", vocabulary_size)
    elif not isinstance(prompt, str):
        raise invalid("prompt", "must be a string, a list of one string, or a list of token ids")
    if body.get("suffix"):
        raise invalid("suffix", "suffix is not supported")
    _token_ids(list(params.stop_token_ids), "stop_token_ids", vocabulary_size)
    return CompletionRequest(
        model=model,
        prompt=prompt,
        params=params,
        seed=seed,
        logprobs=_int(body, "logprobs", 0, MAX_TOP_LOGPROBS),
        return_token_ids=_bool(body, "return_token_ids", False),
        return_tokens_as_token_ids=_bool(body, "return_tokens_as_token_ids", False),
    )


@dataclass(frozen=True)
class GenerateRequest:
    """A validated SGLang-style /generate request: token ids in, token ids and log-probs out."""

    input_ids: tuple[int, ...]
    params: SamplingParams
    seed: int | None
    return_logprob: bool
    top_logprobs: int
    stream: bool


def parse_generate(body: Mapping[str, Any], default_max_tokens: int, vocabulary_size: int) -> GenerateRequest:
    """Validate a /generate body (`input_ids`, `sampling_params`, `return_logprob`, `stream`)."""
    if "text" in body and "input_ids" not in body:
        raise invalid("input_ids", "this server takes token ids; send input_ids, not text")
    ids = _token_ids(body.get("input_ids"), "input_ids", vocabulary_size)
    if not ids:
        raise invalid("input_ids", "is required: a non-empty list of token ids")
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, Mapping):
        raise invalid("sampling_params", "must be an object")
    renamed = {"max_tokens" if k == "max_new_tokens" else k: v for k, v in sampling.items()}
    unknown = set(renamed) - {
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "stop_token_ids",
        "n",
        "seed",
        "skip_special_tokens",
    }
    if unknown:
        raise invalid(f"sampling_params.{sorted(unknown)[0]}", "is not supported by the reference model")
    try:
        _, params, seed = _common({"model": "generate", **renamed}, default_max_tokens, chat=False)
    except ApiError as exc:
        raise invalid(f"sampling_params.{exc.param}", exc.message.split(": ", 1)[-1]) from None
    return GenerateRequest(
        input_ids=ids,
        params=params,
        seed=seed,
        return_logprob=_bool(body, "return_logprob", False),
        top_logprobs=_int(body, "top_logprobs_num", 0, MAX_TOP_LOGPROBS) or 0,
        stream=_bool(body, "stream", False),
    )
