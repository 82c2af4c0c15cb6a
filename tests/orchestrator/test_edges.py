"""Typed edges on trees whose answer is known, in SQLite and in PostgreSQL (`ledgers.py`): the
requests have the shapes Claude Code 2.1's give them (its system prompts, its tool listings, its
compaction and continuation messages, as its pinned binary holds them), recorded in the order it
makes them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.messages import branch_to_pb
from orchestrator.cli.render import tree_order
from orchestrator.client import BranchInfo
from orchestrator.trajectory import CanonicalRequest, Ledger, Turn
from orchestrator.trajectory.canonical import canonical_message
from orchestrator.trajectory.edges import Edge, shape, spawns
from protos.shared import wire
from tests.orchestrator.ledgers import DATABASES, opener

MAIN_SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude."
AGENT_SYSTEM = (
    "You are an agent for Claude Code, Anthropic's official CLI for Claude. Given the user's message, you"
    " should use the tools available to complete the task."
)
TITLE_SYSTEM = (
    "Generate a concise, sentence-case title (3-7 words) that captures the main topic of this session."
)
COMPACT = (
    "Your task is to create a detailed summary of the conversation so far, paying close attention to the"
    " user's explicit requests and your previous actions."
)
CONTINUED = (
    "This session is being continued from a previous conversation that ran out of context. The summary"
    " below covers the earlier portion of the conversation.\n\n"
)
TASK = "Create notes.txt listing three facts about the sea, then check the file."


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


MAIN_TOOLS = [_tool("Bash"), _tool("Write"), _tool("Task")]
AGENT_TOOLS = [_tool("Bash"), _tool("Write")]


@pytest.fixture(params=DATABASES)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    with opener(request, tmp_path / "state.db") as open_:
        yield open_()


def _ask(
    system: str, tools: list[Any] | None, *messages: dict[str, Any], max_tokens: int = 32000
) -> CanonicalRequest:
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": max_tokens,
        "messages": [{"role": "system", "content": system}, *messages],
    }
    if tools:
        body["tools"] = tools
    return CanonicalRequest.parse("chat", body, protocol="messages", stream=True)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _said(text: str = "", **calls: dict[str, Any]) -> dict[str, Any]:
    """The model's message: its text and its tool calls (id: (name, arguments))."""
    out: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        out["tool_calls"] = [
            {
                "id": i,
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["input"])},
            }
            for i, c in calls.items()
        ]
    return out


def _result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _record(ledger: Ledger, request: CanonicalRequest, said: dict[str, Any], run: int = 1,
            resumed_at: float = 0.0) -> Turn:  # fmt: skip
    arguments = [c["function"]["arguments"] for c in said.get("tool_calls") or []]
    return ledger.record("ep-1", run, resumed_at, request, b"{}", canonical_message(said), b"", "messages", b"",
                         [1, 2], [-0.5, -0.25], [], "v1", 1.0, spawns=spawns(arguments), tools_key=request.tools_key)  # fmt: skip


def _tree(ledger: Ledger) -> dict[int, tuple[str, int | None, int, bool]]:
    return {t.id: (t.edge, t.edge_parent, t.branch, t.abandoned) for t in ledger.turns("ep-1")}


@pytest.mark.timeout(30)
def test_a_claude_code_session_main_follows_its_primary_conversation_through_a_compaction(
    ledger: Ledger,
) -> None:
    """A title side call recorded first, the main conversation, a subagent its Task call spawns, a
    small-model side call, a compaction and the conversation that continues from its summary:
    main is the primary conversation's turns, across the compaction, and nothing else."""
    title = _record(ledger, _ask(TITLE_SYSTEM, None, _user(TASK), max_tokens=512), _said("Sea facts notes"))
    assert (title.edge, title.branch) == (Edge.ROOT, 0), "alone, it is all there is"
    first = [_user(TASK)]
    spawn = _said(
        "",
        t1={"name": "Task", "input": {"description": "facts", "prompt": "Find three facts about the sea."}},
    )
    m1 = _record(ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, *first), spawn)
    agent = [_user("<system-reminder>Be brief.</system-reminder>Find three facts about the sea.")]
    s1 = _record(
        ledger,
        _ask(AGENT_SYSTEM, AGENT_TOOLS, *agent),
        _said("", a1={"name": "Bash", "input": {"command": "ls"}}),
    )
    s2 = _record(ledger, _ask(AGENT_SYSTEM, AGENT_TOOLS, *agent, _said("", a1={"name": "Bash", "input": {"command": "ls"}}),
                              _result("a1", "")), _said("Salt, tides, depth."))  # fmt: skip
    quota = _record(ledger, _ask("", None, _user("quota"), max_tokens=1), _said("ok"))
    main = [*first, spawn, _result("t1", "Salt, tides, depth.")]
    write = _said("", t2={"name": "Write", "input": {"file_path": "notes.txt", "content": "salt"}})
    m2 = _record(ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, *main), write)
    main += [write, _result("t2", "written")]
    summary = "The user asked for notes.txt with three facts about the sea; it was written."
    compaction = _record(ledger, _ask(MAIN_SYSTEM, None, *main, _user(COMPACT)), _said(summary))
    after = [_user(CONTINUED + summary)]
    m3 = _record(
        ledger,
        _ask(MAIN_SYSTEM, MAIN_TOOLS, *after),
        _said("", t3={"name": "Bash", "input": {"command": "cat notes.txt"}}),
    )
    m4 = _record(ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, *after, _said("", t3={"name": "Bash", "input": {"command": "cat notes.txt"}}),
                              _result("t3", "salt")), _said("Done."))  # fmt: skip

    tree = _tree(ledger)
    assert {i: (edge, parent) for i, (edge, parent, _, _) in tree.items()} == {
        title.id: (Edge.SIDE_CALL, None),
        m1.id: (Edge.ROOT, None),
        s1.id: (Edge.SUBAGENT, m1.id),
        s2.id: (Edge.CONTINUATION, s1.id),
        quota.id: (Edge.SIDE_CALL, None),
        m2.id: (Edge.CONTINUATION, m1.id),
        compaction.id: (Edge.COMPACTION, m2.id),
        m3.id: (Edge.CONTINUATION, compaction.id),
        m4.id: (Edge.CONTINUATION, m3.id),
    }
    main_branch = ledger.branches("ep-1")[0]
    assert main_branch.id == 0 and [t.id for t in main_branch.turns] == [m1.id, m2.id, m3.id, m4.id]
    assert tree[s1.id][2] == tree[s2.id][2] != 0, "the subagent keeps a branch of its own"
    assert len({tree[t.id][2] for t in (title, quota, compaction, s1)}) == 4, "each on its own branch"
    assert sorted({b for _, _, b, _ in tree.values()}) == list(range(5)), "no branch number is skipped"
    # As the API carries it and `stasis trajectory` lays it out: each turn under the one it
    # hangs from, indented where it leaves a branch.
    branches = [wire.decode(branch_to_pb(b), BranchInfo) for b in ledger.branches("ep-1")]
    assert [(b.id, b.edge) for b in branches] == [
        (0, "root"), (1, "side_call"), (2, "subagent"), (3, "side_call"), (4, "compaction"),
    ]  # fmt: skip
    laid_out = [
        (t.id, t.edge, t.edge_parent, depth)
        for t, depth in tree_order([t for b in branches for t in b.turns])
    ]
    assert laid_out == [
        (title.id, "side_call", 0, 0),
        (m1.id, "root", 0, 0),
        (s1.id, "subagent", m1.id, 1),
        (s2.id, "continuation", s1.id, 1),
        (m2.id, "continuation", m1.id, 0),
        (compaction.id, "compaction", m2.id, 1),
        (m3.id, "continuation", compaction.id, 0),
        (m4.id, "continuation", m3.id, 0),
        (quota.id, "side_call", 0, 0),
    ]


@pytest.mark.timeout(30)
def test_a_divergence_after_a_restore_beside_a_live_sibling_keeps_main_whole(ledger: Ledger) -> None:
    """Parallel calls P1 and P2 from one turn; after the restore P2 is replayed and P1's request
    comes back different: P1, which the sandbox never had, is abandoned, and the new turn takes
    its place on main, beside the live P2."""
    root = [_user(TASK)]
    calls = _said(
        "", c1={"name": "Bash", "input": {"command": "a"}}, c2={"name": "Bash", "input": {"command": "b"}}
    )
    a = _record(ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, *root), calls)
    ledger.delivered(a.id, 10.0, 1)
    p1 = _record(ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, *root, calls, _result("c1", "one")), _said("p1"))
    p2 = _record(ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, *root, calls, _result("c2", "two")), _said("p2"))
    ledger.delivered(p2.id, 15.0, 1)  # P2 reached the harness before the freeze at 20; P1 after it
    ledger.delivered(p1.id, 25.0, 1)
    assert (p1.edge, p1.branch, p2.edge, p2.branch) == (Edge.CONTINUATION, 0, Edge.PARALLEL, 1)

    assert (
        ledger.replay("ep-1", 2, _ask(MAIN_SYSTEM, MAIN_TOOLS, *root, calls, _result("c2", "two")))
        is not None
    )
    p1_again = _record(ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, *root, calls, _result("c1", "uno")), _said("p1'"),
                       run=2, resumed_at=20.0)  # fmt: skip
    tree = _tree(ledger)
    assert tree == {
        a.id: (Edge.ROOT, None, 0, False),
        p1.id: (Edge.CONTINUATION, a.id, 2, True),
        p2.id: (Edge.PARALLEL, a.id, 1, False),
        p1_again.id: (Edge.DIVERGENCE, a.id, 0, False),
    }
    assert [t.id for t in ledger.branches("ep-1")[0].turns] == [a.id, p1_again.id], "main is whole"


def test_shapes_tell_a_compaction_and_a_continued_session() -> None:
    assert shape(_ask(MAIN_SYSTEM, None, _user(TASK), _said("x"), _user(COMPACT))).asks_for_summary
    assert not shape(_ask(MAIN_SYSTEM, MAIN_TOOLS, _user("Summarise the file for me."))).asks_for_summary
    assert shape(_ask(MAIN_SYSTEM, MAIN_TOOLS, _user(CONTINUED + "..."))).continues_summary([])
    assert shape(_ask(MAIN_SYSTEM, MAIN_TOOLS, _user("Earlier: we wrote notes."))).continues_summary(
        ["we wrote notes"]
    )
    assert spawns(
        ['{"prompt": " Find facts.\\r\\n", "description": "d"}', '{"command": "ls"}', "not json"]
    ) == ["Find facts."]


@pytest.mark.timeout(30)
def test_a_session_continued_from_a_summary_made_elsewhere_carries_main_on(ledger: Ledger) -> None:
    m1 = _record(ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, _user(TASK)), _said("Working on it."))
    m2 = _record(
        ledger, _ask(MAIN_SYSTEM, MAIN_TOOLS, _user(CONTINUED + "notes.txt was written.")), _said("Done.")
    )
    assert _tree(ledger) == {m1.id: (Edge.ROOT, None, 0, False), m2.id: (Edge.CONTINUATION, None, 0, False)}
