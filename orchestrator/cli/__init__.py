"""`stasis` (also installed as the kubectl plugin `kubectl-stasis`): run, submit, inspect,
preempt; and `stasis up`, a whole Stasis on this machine.

Owns the command line and the local stack. Errors print one line and exit 1; the server address
comes from --addr or STASIS_ADDR. The top room: it may import every other, and none imports it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from orchestrator.cli.commands import Subcommands
from orchestrator.cli.parser import invoked_as, parser
from orchestrator.domain import StasisError, TemporaryError

__all__ = ["entry", "main", "parser"]


def main(argv: list[str] | None = None, out: Any = sys.stdout, err: Any = sys.stderr) -> int:
    prog = invoked_as(sys.argv[0])
    args = parser(prog).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command in ("up", "server") else logging.WARNING
    )
    handler: Callable[[], int] = getattr(Subcommands(args, out, err), args.command)
    try:
        return handler()
    except TemporaryError as exc:
        print(f"{prog}: {exc} (is `stasis up` running? set --addr or STASIS_ADDR)", file=err)
    except (StasisError, TimeoutError) as exc:
        print(f"{prog}: {exc}", file=err)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=err)
    except BrokenPipeError:
        # The reader (head, less) went away: stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 1


def entry() -> None:
    sys.exit(main())
