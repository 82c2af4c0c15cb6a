"""How each model server takes a prompt as token ids and gives its sampled ids and their
log-probs back, whole or streamed.

- vLLM (`vllm`): `POST /v1/completions` with `prompt` a list of ids, `logprobs` with
  `return_tokens_as_token_ids` and `stop_token_ids`; the sampled ids from the log-prob entries'
  `token_id:<id>` labels (or `choices[0].token_ids`) and their `token_logprobs` (streamed: each
  chunk's new ones). `return_token_ids` is not asked for: it would echo the whole prompt back.
- SGLang (`sglang`): `POST /generate` with `input_ids`, `sampling_params` and `return_logprob`;
  the answer's `output_ids` and `meta_info.output_token_logprobs` (streamed: everything so far in
  each chunk, or only the new ids where the server streams increments).

The reference model serves both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from orchestrator.gateway.generation import UpstreamFault, check_sampled
from orchestrator.trajectory.turns import Sampling


@dataclass
class TokenSample:
    """A token-level generation, accumulated as it arrives."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)
    """The prompt as the server echoed it, where it does."""
    policy_version: str = ""
    """The weights that sampled, where the answer names them (SGLang's `weight_version`)."""

    def check(self, prompt_ids: list[int]) -> None:
        """Refuse a generation the ledger cannot record exactly."""
        check_sampled(self.finish_reason, self.token_ids, self.logprobs)
        if self.prompt_token_ids and self.prompt_token_ids != prompt_ids:
            raise UpstreamFault("the model server echoed a prompt other than the token ids it was sent")


class Dialect(ABC):
    name: str
    path: str
    root: bool
    """The path is below the server's root, not its OpenAI base."""

    @abstractmethod
    def body(
        self,
        model: str,
        prompt_ids: list[int],
        sampling: Sampling,
        stop_ids: list[int],
        stream: bool,
        **extra: Any,
    ) -> dict[str, Any]: ...

    @abstractmethod
    def add(self, sample: TokenSample, data: dict[str, Any]) -> None:
        """Fold one answer, or one streamed chunk, into the sample."""

    @abstractmethod
    def ask_top_logprobs(self, body: dict[str, Any], k: int) -> None:
        """Ask in `body` for each sampled token's k most likely alternatives."""

    @abstractmethod
    def top_logprobs(self, data: dict[str, Any]) -> list[float]:
        """The first sampled token's alternatives' log-probs, from an answer, in ascending order."""


def _sampling(sampling: Sampling, max_tokens: str) -> dict[str, Any]:
    """The sampling settings in a route's names (`max_tokens` its name for the token limit)."""
    out: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    if sampling.top_k > 0:
        out["top_k"] = sampling.top_k
    if sampling.max_tokens:
        out[max_tokens] = sampling.max_tokens
    return out


class Vllm(Dialect):
    name, path, root = "vllm", "/completions", False

    def body(
        self,
        model: str,
        prompt_ids: list[int],
        sampling: Sampling,
        stop_ids: list[int],
        stream: bool,
        **extra: Any,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids,
            **_sampling(sampling, "max_tokens"),
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "stop_token_ids": stop_ids,
            "skip_special_tokens": False,
            **extra,
        }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def add(self, sample: TokenSample, data: dict[str, Any]) -> None:
        if data.get("prompt_token_ids"):
            sample.prompt_token_ids = list(data["prompt_token_ids"])
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                raise UpstreamFault("the model server returned more than one choice")
            if choice.get("prompt_token_ids"):
                sample.prompt_token_ids = list(choice["prompt_token_ids"])
            logprobs = choice.get("logprobs") or {}
            ids = choice.get("token_ids")
            if ids is None:
                ids = [label.removeprefix("token_id:") for label in logprobs.get("tokens") or []]
            sample.token_ids += [int(t) for t in ids]
            sample.logprobs += [float(x) for x in logprobs.get("token_logprobs") or []]
            if choice.get("finish_reason"):
                sample.finish_reason = str(choice["finish_reason"])

    def ask_top_logprobs(self, body: dict[str, Any], k: int) -> None:
        body["logprobs"] = k

    def top_logprobs(self, data: dict[str, Any]) -> list[float]:
        tops = ((data.get("choices") or [{}])[0].get("logprobs") or {}).get("top_logprobs") or [{}]
        return sorted(float(x) for x in (tops[0] or {}).values())


class Sglang(Dialect):
    name, path, root = "sglang", "/generate", True

    def body(
        self,
        model: str,
        prompt_ids: list[int],
        sampling: Sampling,
        stop_ids: list[int],
        stream: bool,
        **extra: Any,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            **_sampling(sampling, "max_new_tokens"),
            "stop_token_ids": stop_ids,
            "skip_special_tokens": False,
        }
        for key in ("seed", "stop"):
            if key in extra:
                params[key] = extra[key]
        return {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True, "stream": stream}

    def add(self, sample: TokenSample, data: dict[str, Any]) -> None:
        meta = data.get("meta_info") or {}
        sample.policy_version = str(meta.get("weight_version") or sample.policy_version)
        ids = [int(t) for t in data.get("output_ids") or []]
        logprobs = [float(e[0]) for e in meta.get("output_token_logprobs") or []]
        # Everything so far (SGLang's default), or only what is new (its incremental streaming).
        if (
            len(ids) == int(meta.get("completion_tokens", -1))
            and ids[: len(sample.token_ids)] == sample.token_ids
        ):
            ids = ids[len(sample.token_ids) :]
        if len(logprobs) > len(ids):
            logprobs = logprobs[len(sample.logprobs) :]
        sample.token_ids += ids
        sample.logprobs += logprobs
        finish = meta.get("finish_reason")
        if isinstance(finish, dict):
            sample.finish_reason = "length" if finish.get("type") == "length" else "stop"
        elif isinstance(finish, str) and finish:
            sample.finish_reason = finish

    def ask_top_logprobs(self, body: dict[str, Any], k: int) -> None:
        body["top_logprobs_num"] = k

    def top_logprobs(self, data: dict[str, Any]) -> list[float]:
        tops = (data.get("meta_info") or {}).get("output_top_logprobs") or [[]]
        return sorted(float(e[0]) for e in tops[0] or [])


DIALECTS: dict[str, Dialect] = {d.name: d for d in (Vllm(), Sglang())}
