"""The trajectory ledger's tables, in SQLite (the state dir's state.db) and in PostgreSQL (the
state store's database), column for column, so that one set of statements (`ledger.py`) runs
on both.

PostgreSQL's types are those of the state store's tables (`state/postgres_schema.py`): times
DOUBLE PRECISION, integers BIGINT (SQLite's are 64-bit), bytes BYTEA. A turn's id is an identity
column, which like AUTOINCREMENT never hands out an id twice; writers take turns (WRITER_LOCK),
so ids grow in commit order, as a snapshot's ledger cursor needs. Flags stay integers (0 or 1),
so the statements compare them alike on both.

A turn whose prompt extends its parent's prompt and sampled ids stores only the prompt tokens it
adds (`prompt_token_ids`), after the first `prompt_base` of them, which are its parent's: an
episode's prompts take room in proportion to its tokens, not to the square of them.

`policy_versions` holds every policy version a trainer published (`policy.py`),
`upstream_failures` each run's last model-server failure (`outages.py`), and `fork_origins` where
each fork child was forked from (its parent, the snapshot and that snapshot's ledger cursor,
`forks.py`); a database from before them gains the tables when a ledger opens it.

Columns added since a table first shipped are in `ADDED`, and a ledger opened on an older
table adds them (`Ledger.sqlite`, `Ledger.postgres`); older turns read as text-mode turns whose
prompts were not checked, sampled with the defaults (temperature 1, no top-p).
"""

SQLITE = """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    episode_id TEXT NOT NULL,
    parent_id INTEGER,
    branch INTEGER NOT NULL,
    run INTEGER NOT NULL,
    kind TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    after_hash TEXT NOT NULL,
    after_len INTEGER NOT NULL,
    request TEXT NOT NULL,
    request_raw BLOB NOT NULL,
    answer TEXT NOT NULL,
    response BLOB NOT NULL,
    protocol TEXT NOT NULL,
    delivered BLOB NOT NULL,
    delivered_run INTEGER NOT NULL,
    delivered_at REAL,
    token_ids TEXT NOT NULL,
    logprobs TEXT NOT NULL,
    prompt_token_ids TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    abandoned INTEGER NOT NULL DEFAULT 0,
    replays INTEGER NOT NULL DEFAULT 0,
    upstream_ms REAL NOT NULL,
    created_at REAL NOT NULL,
    mode TEXT NOT NULL DEFAULT 'text',
    prefix_exact INTEGER,
    common_prefix INTEGER NOT NULL DEFAULT 0,
    break_reason TEXT NOT NULL DEFAULT '',
    finish_reason TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}',
    logprobs_mode TEXT NOT NULL DEFAULT '',
    tools_key TEXT NOT NULL DEFAULT '',
    prompt_base INTEGER NOT NULL DEFAULT 0,
    sending_run INTEGER NOT NULL DEFAULT 0,
    sending_at REAL,
    edge TEXT NOT NULL DEFAULT '',
    edge_parent INTEGER,
    spawns TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS turns_episode ON turns(episode_id, id);
CREATE INDEX IF NOT EXISTS turns_fingerprint ON turns(episode_id, fingerprint);
CREATE INDEX IF NOT EXISTS turns_after ON turns(episode_id, after_hash);
CREATE INDEX IF NOT EXISTS turns_parent ON turns(episode_id, parent_id, abandoned, delivered_run);
CREATE INDEX IF NOT EXISTS turns_branch ON turns(episode_id, branch);
CREATE TABLE IF NOT EXISTS verifications (
    episode_id TEXT PRIMARY KEY,
    reward REAL,
    exit_code INTEGER,
    timed_out INTEGER NOT NULL,
    log BLOB NOT NULL,
    duration_ms REAL NOT NULL,
    at REAL NOT NULL,
    metrics TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS policy_versions (
    version INTEGER PRIMARY KEY,
    published_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fork_origins (
    episode_id TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    snapshot_id TEXT NOT NULL,
    cursor INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS upstream_failures (
    episode_id TEXT NOT NULL,
    run INTEGER NOT NULL,
    failed_at REAL NOT NULL,
    why TEXT NOT NULL,
    rerun INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (episode_id, run)
);
"""

POSTGRES = """
CREATE TABLE IF NOT EXISTS turns (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    episode_id TEXT NOT NULL,
    parent_id BIGINT,
    branch BIGINT NOT NULL,
    run BIGINT NOT NULL,
    kind TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    after_hash TEXT NOT NULL,
    after_len BIGINT NOT NULL,
    request TEXT NOT NULL,
    request_raw BYTEA NOT NULL,
    answer TEXT NOT NULL,
    response BYTEA NOT NULL,
    protocol TEXT NOT NULL,
    delivered BYTEA NOT NULL,
    delivered_run BIGINT NOT NULL,
    delivered_at DOUBLE PRECISION,
    token_ids TEXT NOT NULL,
    logprobs TEXT NOT NULL,
    prompt_token_ids TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    abandoned BIGINT NOT NULL DEFAULT 0,
    replays BIGINT NOT NULL DEFAULT 0,
    upstream_ms DOUBLE PRECISION NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    mode TEXT NOT NULL DEFAULT 'text',
    prefix_exact BIGINT,
    common_prefix BIGINT NOT NULL DEFAULT 0,
    break_reason TEXT NOT NULL DEFAULT '',
    finish_reason TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}',
    logprobs_mode TEXT NOT NULL DEFAULT '',
    tools_key TEXT NOT NULL DEFAULT '',
    prompt_base BIGINT NOT NULL DEFAULT 0,
    sending_run BIGINT NOT NULL DEFAULT 0,
    sending_at DOUBLE PRECISION,
    edge TEXT NOT NULL DEFAULT '',
    edge_parent BIGINT,
    spawns TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS turns_episode ON turns(episode_id, id);
CREATE INDEX IF NOT EXISTS turns_fingerprint ON turns(episode_id, fingerprint);
CREATE INDEX IF NOT EXISTS turns_after ON turns(episode_id, after_hash);
CREATE INDEX IF NOT EXISTS turns_parent ON turns(episode_id, parent_id, abandoned, delivered_run);
CREATE INDEX IF NOT EXISTS turns_branch ON turns(episode_id, branch);
CREATE TABLE IF NOT EXISTS verifications (
    episode_id TEXT PRIMARY KEY,
    reward DOUBLE PRECISION,
    exit_code BIGINT,
    timed_out BIGINT NOT NULL,
    log BYTEA NOT NULL,
    duration_ms DOUBLE PRECISION NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    metrics TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS policy_versions (
    version BIGINT PRIMARY KEY,
    published_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS fork_origins (
    episode_id TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    snapshot_id TEXT NOT NULL,
    cursor BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS upstream_failures (
    episode_id TEXT NOT NULL,
    run BIGINT NOT NULL,
    failed_at DOUBLE PRECISION NOT NULL,
    why TEXT NOT NULL,
    rerun BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (episode_id, run)
);
"""

ADDED = {
    "turns": (
        ("mode", "TEXT NOT NULL DEFAULT 'text'"),
        ("prefix_exact", "{integer}"),
        ("common_prefix", "{integer} NOT NULL DEFAULT 0"),
        ("break_reason", "TEXT NOT NULL DEFAULT ''"),
        ("finish_reason", "TEXT NOT NULL DEFAULT ''"),
        ("sampling", "TEXT NOT NULL DEFAULT '{{}}'"),
        ("logprobs_mode", "TEXT NOT NULL DEFAULT ''"),
        ("tools_key", "TEXT NOT NULL DEFAULT ''"),
        ("prompt_base", "{integer} NOT NULL DEFAULT 0"),
        ("sending_run", "{integer} NOT NULL DEFAULT 0"),
        ("sending_at", "{real}"),
        ("edge", "TEXT NOT NULL DEFAULT ''"),
        ("edge_parent", "{integer}"),
        ("spawns", "TEXT NOT NULL DEFAULT '[]'"),
    ),
    "verifications": (("metrics", "TEXT NOT NULL DEFAULT '{{}}'"),),
}
"""Columns added since each table first shipped: (name, type with `{integer}` and `{real}` for
the database's integer and floating-point types)."""


def added_columns(present: dict[str, set[str]], integer: str = "INTEGER", real: str = "REAL") -> list[str]:
    """SQLite's statements that add what the tables that exist lack (`present`: each one's columns)."""
    return [
        f"ALTER TABLE {table} ADD COLUMN {name} {kind.format(integer=integer, real=real)}"
        for table, columns in ADDED.items()
        if present.get(table)
        for name, kind in columns
        if name not in present[table]
    ]


POSTGRES_ADDED = "".join(
    f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} "
    f"{kind.format(integer='BIGINT', real='DOUBLE PRECISION')};\n"
    for table, columns in ADDED.items()
    for name, kind in columns
)
"""PostgreSQL's statements that add them to an older table (and do nothing to a new one)."""


TURN_COLUMNS = tuple(
    line.split()[0]
    for line in SQLITE.split("CREATE TABLE IF NOT EXISTS turns (")[1].split(");")[0].strip().splitlines()
)
"""The turns table's columns, in order."""
