"""The PostgreSQL state store's tables: those of the embedded store (`schema.py`), column for
column, in PostgreSQL's types.

Times are DOUBLE PRECISION (PostgreSQL's REAL has only 24 bits of mantissa), counts and sizes
BIGINT, as SQLite's INTEGER is 64-bit. The keys lists are sorted by use the "C" collation, so
they sort bytewise as in SQLite, whatever the database's locale.

One table is PostgreSQL's alone: `leader`, the orchestrator holding the leadership lease
(`postgres_database.PostgresLease`), which only a shared database needs.
"""

from orchestrator.state.schema import ON_NODE_SQL, QUEUED_SQL

SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT COLLATE "C" PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    priority BIGINT NOT NULL,
    labels TEXT NOT NULL,
    address TEXT NOT NULL,
    token TEXT NOT NULL UNIQUE,
    node TEXT NOT NULL DEFAULT '',
    sandbox_id TEXT NOT NULL DEFAULT '',
    runs BIGINT NOT NULL DEFAULT 0,
    run_started_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    run_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
    queued_at DOUBLE PRECISION NOT NULL,
    held BOOLEAN NOT NULL DEFAULT FALSE,
    pinned_node TEXT NOT NULL DEFAULT '',
    snapshots BIGINT NOT NULL DEFAULT 0,
    last_snapshot_id TEXT NOT NULL DEFAULT '',
    restored_from TEXT NOT NULL DEFAULT '',
    pending_snapshot_id TEXT NOT NULL DEFAULT '',
    pending_reason TEXT NOT NULL DEFAULT '',
    last_autosave_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    exit_code BIGINT,
    reward DOUBLE PRECISION,
    submitted_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    not_before DOUBLE PRECISION NOT NULL DEFAULT 0,
    attempts BIGINT NOT NULL DEFAULT 0,
    log_offsets TEXT NOT NULL DEFAULT '[]',
    group_id TEXT NOT NULL DEFAULT '',
    group_index BIGINT NOT NULL DEFAULT 0,
    forked_from TEXT NOT NULL DEFAULT '',
    fork_parent TEXT NOT NULL DEFAULT '',
    fork_index BIGINT NOT NULL DEFAULT 0,
    key_of TEXT NOT NULL DEFAULT ''
);
-- A database from before GRPO groups: its episodes are in none. Checked first, as for snapshots.
DO $$ BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = 'episodes' AND column_name = 'group_id'
    ) THEN
        ALTER TABLE episodes ADD COLUMN group_id TEXT NOT NULL DEFAULT '',
            ADD COLUMN group_index BIGINT NOT NULL DEFAULT 0;
    END IF;
END $$;
-- A database from before forks: no episode is a fork child.
DO $$ BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = 'episodes' AND column_name = 'forked_from'
    ) THEN
        ALTER TABLE episodes ADD COLUMN forked_from TEXT NOT NULL DEFAULT '',
            ADD COLUMN fork_parent TEXT NOT NULL DEFAULT '',
            ADD COLUMN fork_index BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN key_of TEXT NOT NULL DEFAULT '';
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS episodes_state ON episodes(state);
CREATE UNIQUE INDEX IF NOT EXISTS episodes_live_address ON episodes(address) WHERE finished_at = 0;
CREATE TABLE IF NOT EXISTS events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    episode_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL,
    node TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    actor TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_episode ON events(episode_id, seq);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    episode_id TEXT NOT NULL,
    sequence BIGINT NOT NULL,
    parent_id TEXT NOT NULL,
    node TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    logical_bytes BIGINT NOT NULL,
    stored_bytes BIGINT NOT NULL,
    new_bytes BIGINT NOT NULL,
    trajectory_cursor TEXT NOT NULL,
    timings_ms TEXT NOT NULL,
    manifest_digest TEXT NOT NULL DEFAULT ''
);
-- A database from before manifests were digested: its snapshots keep '' (never restored).
-- Checked first, so that a server starting beside a leader takes no lock on the table.
DO $$ BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = 'snapshots'
            AND column_name = 'manifest_digest'
    ) THEN
        ALTER TABLE snapshots ADD COLUMN manifest_digest TEXT NOT NULL DEFAULT '';
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS snapshots_episode ON snapshots(episode_id, sequence);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT COLLATE "C" PRIMARY KEY,
    address TEXT NOT NULL,
    state TEXT NOT NULL,
    backend TEXT NOT NULL,
    slots BIGINT NOT NULL,
    memory_mb BIGINT NOT NULL,
    images TEXT NOT NULL,
    labels TEXT NOT NULL,
    registered_at DOUBLE PRECISION NOT NULL,
    disk_mb BIGINT NOT NULL DEFAULT 0,
    restores_forks BOOLEAN NOT NULL DEFAULT FALSE
);
-- Nodes registered before the disk was counted, or before forks.
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS disk_mb BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS restores_forks BOOLEAN NOT NULL DEFAULT FALSE;
CREATE TABLE IF NOT EXISTS images (
    name TEXT COLLATE "C" PRIMARY KEY,
    reference TEXT NOT NULL,
    digest TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    source TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS logs (
    episode_id TEXT PRIMARY KEY,
    start BIGINT NOT NULL,
    content BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS episode_groups (
    id TEXT COLLATE "C" PRIMARY KEY,
    task_id TEXT NOT NULL,
    size BIGINT NOT NULL,
    max_staleness BIGINT,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY,
    method TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    target TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS leader (
    lease INTEGER PRIMARY KEY CHECK (lease = 1),
    holder TEXT NOT NULL,
    since DOUBLE PRECISION NOT NULL,
    term BIGINT NOT NULL
);
"""

ADDED_INDEXES = (
    ("episodes_queue", f"episodes(priority DESC, queued_at, id) WHERE {QUEUED_SQL}"),
    ("episodes_on_node", f"episodes(node) WHERE {ON_NODE_SQL}"),
    ("episodes_ended", "episodes(finished_at, id) WHERE finished_at > 0"),
    ("episodes_group", "episodes(group_id, group_index) WHERE group_id != ''"),
    ("episodes_forks", "episodes(forked_from) WHERE forked_from != ''"),
    ("episodes_key_of", "episodes(key_of) WHERE key_of != ''"),
)
"""Indexes (name, and what follows ON) added after the tables first shipped. A database that holds
many episodes already builds them without blocking writes to its tables (`PostgresDatabase`)."""
