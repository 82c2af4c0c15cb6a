"""`python -m orchestrator.reference_model`: serve the reference model until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings


def parser() -> argparse.ArgumentParser:
    defaults = ReferenceModelSettings()
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.reference_model",
        description="Serve the Stasis reference model (an exact seeded sampler) over the OpenAI API.",
        epilog="""Examples:
  # Serve it on port 8000 of every address
  python -m orchestrator.reference_model --host 0.0.0.0 --port 8000

  # Another seed, raw log-probs as vLLM's --logprobs-mode raw, every request logged
  python -m orchestrator.reference_model --seed 7 --logprobs-mode raw --access-log""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default=defaults.host, help="address to bind (default %(default)s)")
    parser.add_argument(
        "--port", type=int, default=defaults.port, help="port; 0 picks a free one (default %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=defaults.seed, help="weights and server RNG seed (default %(default)s)"
    )
    parser.add_argument(
        "--policy-version", default=defaults.policy_version, help="policy version (default %(default)s)"
    )
    parser.add_argument(
        "--model-name", default=defaults.model_name, help="id listed by /v1/models (default %(default)s)"
    )
    parser.add_argument(
        "--mean-tool-turns",
        type=float,
        default=defaults.mean_tool_turns,
        help="tool results after which answering beats calling (default %(default)s)",
    )
    parser.add_argument(
        "--mean-answer-tokens",
        type=float,
        default=defaults.mean_answer_tokens,
        help="answer length at which ending beats continuing (default %(default)s)",
    )
    parser.add_argument(
        "--think-probability",
        type=float,
        default=defaults.think_probability,
        help="chance a turn opens with reasoning (default %(default)s)",
    )
    parser.add_argument(
        "--logprobs-mode",
        choices=("processed", "raw"),
        default=defaults.logprobs_mode,
        help="log-probs of the sampling distribution (processed) or before temperature and top-p (raw), "
        "as vLLM's --logprobs-mode (default %(default)s)",
    )
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=defaults.default_max_tokens,
        help="chat max_tokens when a request sets none (default %(default)s)",
    )
    parser.add_argument("--access-log", action="store_true", help="log every HTTP request to stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT."""
    args = parser().parse_args(argv)
    try:
        settings = ReferenceModelSettings(
            host=args.host,
            port=args.port,
            seed=args.seed,
            policy_version=args.policy_version,
            model_name=args.model_name,
            mean_tool_turns=args.mean_tool_turns,
            mean_answer_tokens=args.mean_answer_tokens,
            think_probability=args.think_probability,
            logprobs_mode=args.logprobs_mode,
            default_max_tokens=args.default_max_tokens,
            access_log=args.access_log,
        )
    except ValueError as error:
        print(f"reference model: {error}", file=sys.stderr)
        return 2
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    server = ReferenceModelServer(settings).start()
    try:
        print(f"reference model listening on {server.url}", flush=True)
        # A bounded wait keeps the main thread responsive to signals.
        while not stopping.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
