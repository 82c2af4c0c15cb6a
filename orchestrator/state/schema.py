"""The embedded state store's tables. Every column of `episodes` is a field of `Episode`, plus
the priority and labels it is queried by."""

QUEUED_SQL = "NOT held AND (state = 'PREEMPTED' OR (state = 'PENDING' AND node = ''))"
"""The episodes that wait for a slot and may have one (`Episode.queued`, and not held): the rows
of the index `episodes_queue`, in the scheduler's order. A query reads that index only if its
condition holds this text as it is (`episodes.SqlEpisodes.queue`)."""

ON_NODE_SQL = "finished_at = 0 AND node != ''"
"""The live episodes on a node: the rows of the index `episodes_on_node`, which a query reads
only if its condition holds this text as it is (`episodes.SqlEpisodes.on_nodes`)."""

GROUP_MEMBERS_INDEX = (
    "CREATE INDEX IF NOT EXISTS episodes_group ON episodes(group_id, group_index) WHERE group_id != ''"
)
"""Made once the episodes table has its group columns: after the migration of a database from
before groups (`SqliteStateStore`)."""

FORKS_INDEX = "CREATE INDEX IF NOT EXISTS episodes_forks ON episodes(forked_from) WHERE forked_from != ''"
"""The children of each forked snapshot (`Snapshots.forks`), and the live ones that hold a
key of another episode (`Episodes.keyed_by`); made after the migration, as `GROUP_MEMBERS_INDEX`."""

KEYED_BY_INDEX = "CREATE INDEX IF NOT EXISTS episodes_key_of ON episodes(key_of) WHERE key_of != ''"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    priority INTEGER NOT NULL,
    labels TEXT NOT NULL,
    address TEXT NOT NULL,
    token TEXT NOT NULL UNIQUE,
    node TEXT NOT NULL DEFAULT '',
    sandbox_id TEXT NOT NULL DEFAULT '',
    runs INTEGER NOT NULL DEFAULT 0,
    run_started_at REAL NOT NULL DEFAULT 0,
    run_seconds REAL NOT NULL DEFAULT 0,
    queued_at REAL NOT NULL,
    held INTEGER NOT NULL DEFAULT 0,
    pinned_node TEXT NOT NULL DEFAULT '',
    snapshots INTEGER NOT NULL DEFAULT 0,
    last_snapshot_id TEXT NOT NULL DEFAULT '',
    restored_from TEXT NOT NULL DEFAULT '',
    pending_snapshot_id TEXT NOT NULL DEFAULT '',
    pending_reason TEXT NOT NULL DEFAULT '',
    last_autosave_at REAL NOT NULL DEFAULT 0,
    exit_code INTEGER,
    reward REAL,
    submitted_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    log_offsets TEXT NOT NULL DEFAULT '[]',
    group_id TEXT NOT NULL DEFAULT '',
    group_index INTEGER NOT NULL DEFAULT 0,
    forked_from TEXT NOT NULL DEFAULT '',
    fork_parent TEXT NOT NULL DEFAULT '',
    fork_index INTEGER NOT NULL DEFAULT 0,
    key_of TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS episodes_state ON episodes(state);
CREATE UNIQUE INDEX IF NOT EXISTS episodes_live_address ON episodes(address) WHERE finished_at = 0;
CREATE INDEX IF NOT EXISTS episodes_queue ON episodes(priority DESC, queued_at, id) WHERE {QUEUED_SQL};
CREATE INDEX IF NOT EXISTS episodes_on_node ON episodes(node) WHERE {ON_NODE_SQL};
CREATE INDEX IF NOT EXISTS episodes_ended ON episodes(finished_at, id) WHERE finished_at > 0;
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    episode_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL,
    node TEXT NOT NULL,
    at REAL NOT NULL,
    actor TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_episode ON events(episode_id, seq);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    episode_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    parent_id TEXT NOT NULL,
    node TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at REAL NOT NULL,
    logical_bytes INTEGER NOT NULL,
    stored_bytes INTEGER NOT NULL,
    new_bytes INTEGER NOT NULL,
    trajectory_cursor TEXT NOT NULL,
    timings_ms TEXT NOT NULL,
    manifest_digest TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS snapshots_episode ON snapshots(episode_id, sequence);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    state TEXT NOT NULL,
    backend TEXT NOT NULL,
    slots INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    images TEXT NOT NULL,
    labels TEXT NOT NULL,
    registered_at REAL NOT NULL,
    disk_mb INTEGER NOT NULL DEFAULT 0,
    restores_forks INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS images (
    name TEXT PRIMARY KEY,
    reference TEXT NOT NULL,
    digest TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    source TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS logs (
    episode_id TEXT PRIMARY KEY,
    start INTEGER NOT NULL,
    content BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS episode_groups (
    id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    size INTEGER NOT NULL,
    max_staleness INTEGER,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY,
    method TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    target TEXT NOT NULL,
    at REAL NOT NULL
);
"""
