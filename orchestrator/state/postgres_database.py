"""A PostgreSQL database as the control plane uses it: a pool of connections that take the
state store's statements as SQLite does, one writer at a time, a listener that wakes watchers
when events commit, and psycopg's errors translated into the control plane's. The one module
that imports psycopg (a contract in pyproject.toml).

The URL may carry a password. It is kept only to connect: everything shown to people, logs and
errors alike, names the database by `where`, which has no password in it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from orchestrator.domain import InvalidArgument, TemporaryError
from orchestrator.state.grouping import GroupCommit
from orchestrator.state.lease import standing_by

log = logging.getLogger(__name__)
T = TypeVar("T")

_Pooled = psycopg.Connection[DictRow]

EVENTS_CHANNEL = "stasis_events"
"""Notified in every transaction that adds an event; delivered when it commits."""
WRITER_LOCK = 0x5354_4153_4953  # "STASIS"
"""Key of the advisory lock every write transaction takes first. Writers queue on it as they do
on SQLite's single writer, so a transaction reads what all earlier ones wrote, and events commit
in `seq` order: a watcher that has read up to some seq never misses a smaller one committed later.
Within one process they queue on a threading lock before it, holding no connection meanwhile."""
INDEX_LOCK = (0x5354_4153, 0x494E_4458)  # "STAS", "INDX"
"""Key of the advisory lock a server holds while it builds indexes (`_build_indexes`)."""
POOL_SIZE = 16
"""Connections for the API threads and the control loop. Reads are short and writes use one
at a time, so more would only hold server memory; PostgreSQL allows 100 by default."""
CONNECT_TIMEOUT_S = 10
"""How long to wait for the server at start-up or on a reconnect before calling it unavailable."""
LINK = {
    "keepalives": 1, "keepalives_idle": 2, "keepalives_interval": 1, "keepalives_count": 2,
    "tcp_user_timeout": 4000,
}  # fmt: skip
"""libpq's TCP settings on every connection to the server: a link that goes silent ends the
connection within about 4 s of the first packet left unanswered (`tcp_user_timeout`, ms), data
and keepalive probes alike, rather than leaving a query hanging for the kernel's ~15 minutes of
retransmissions. A leader checking its lease every second so learns of a silent link within
about 5 s, before the server's own timeouts (`SERVER_KEEPALIVE`) free the lease for a standby.
A slow server is not a silent one: its kernel still acknowledges."""
LISTEN_POLL_S = 0.25
"""How often the listener looks up from its socket to see whether the store was closed."""
RELISTEN_S = 1.0
"""Pause before the listener reconnects after losing its connection."""


class Connection:
    """A connection of the pool that takes statements with `?` placeholders, as SQLite does, so
    the state store's statements (its aggregates') and the trajectory ledger's are written once
    for both databases. Each `?` becomes psycopg's `%s`: none of those statements has a `?` or `%` of its
    own (no string literals, LIKE patterns or jsonb `?` operators)."""

    def __init__(self, db: _Pooled) -> None:
        self._db = db

    def execute(self, statement: str, args: Sequence[object] | None = None) -> psycopg.Cursor[DictRow]:
        return self._db.execute(statement.replace("?", "%s"), args)

    def copy(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> int:
        """Load `rows` into `table` with COPY, the quickest way in; how many there were. Values
        of identity columns are taken as given."""
        count = 0
        with self._db.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
                count += 1
        return count


def where(url: str) -> str:
    """The URL without its password, for logs and errors; InvalidArgument if it is not a
    PostgreSQL URL. The parser's own message is not repeated, as it may quote the password."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise InvalidArgument("database_url", "must be a postgresql://USER:PASSWORD@HOST:PORT/DATABASE URL")
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        raise InvalidArgument("database_url", "is not a valid PostgreSQL URL") from None
    user = f"{params['user']}@" if params.get("user") else ""
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgresql://{user}{params.get('host', '')}{port}/{params.get('dbname', '')}"


class PostgresDatabase:
    """One PostgreSQL database: reads on a pool, one writer at a time, watchers woken on NOTIFY."""

    def __init__(self, url: str, schema: str, indexes: Sequence[tuple[str, str]] = ()) -> None:
        """Connect, and create what of `schema` does not exist yet, then the `indexes` (name, and
        what follows ON) that are missing (`_build_indexes`)."""
        self.where = where(url)
        self._url = url
        self._password = str(conninfo_to_dict(url).get("password") or "")
        with self._translated(), self._connect() as db:
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITER_LOCK,))  # two servers starting at once
                db.execute(schema)
            _build_indexes(db, indexes)
        self._pool = ConnectionPool(
            url,
            connection_class=_Pooled,
            kwargs=dict(autocommit=True, row_factory=dict_row, connect_timeout=CONNECT_TIMEOUT_S, **LINK),
            min_size=1,
            max_size=POOL_SIZE,
            timeout=CONNECT_TIMEOUT_S,
            configure=_durable,
            check=ConnectionPool.check_connection,  # a connection the server dropped is replaced
            name="stasis-state",
            open=True,
        )
        self._writer = threading.Lock()
        self._writing: tuple[int, _Pooled] | None = None
        """The thread inside a write transaction, and that transaction's connection."""
        self._group = GroupCommit(self.tx, lambda: self._own() is not None)
        self.fence: Callable[[Connection], None] | None = None
        """Run first in every write transaction; raises to refuse it (see `PostgresLease`)."""
        self._closing = threading.Event()
        self._changed = threading.Condition()
        self._notifications = 0
        self._listener = threading.Thread(target=self._listen, name="stasis-state-events", daemon=True)
        self._listener.start()

    def _connect(self) -> _Pooled:
        return psycopg.connect(
            make_conninfo(self._url, **LINK), autocommit=True, row_factory=dict_row,
            connect_timeout=CONNECT_TIMEOUT_S,
        )  # fmt: skip

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def close(self) -> None:
        if self.closed:
            return
        self._closing.set()
        self._wake()
        self._listener.join()
        self._pool.close()

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """Where psycopg's errors become the control plane's: a server that cannot be reached is
        worth retrying (the request ids make a retry safe), so it is a TemporaryError."""
        try:
            yield
        except psycopg.OperationalError as exc:
            raise TemporaryError(
                f"the state database {self.where} is unavailable: {self._told(exc)}"
            ) from None

    def _told(self, exc: psycopg.Error) -> str:
        """What psycopg said, with the password masked should the server have quoted it."""
        return str(exc).replace(self._password, "***") if self._password else str(exc)

    def _own(self) -> _Pooled | None:
        """The connection of this thread's write transaction, if it is inside one."""
        writing = self._writing
        return writing[1] if writing is not None and writing[0] == threading.get_ident() else None

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection for reads; each statement sees every transaction committed before it.
        Inside this thread's own write transaction it is that transaction's connection, so the
        reads see its writes."""
        own = self._own()
        if own is not None:
            yield Connection(own)
            return
        with self._translated(), self._pool.connection() as db:
            yield Connection(db)

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        """One write transaction, taken after every earlier writer has committed (WRITER_LOCK).

        Inside this thread's own transaction it is a savepoint: its work commits with the outer
        one, and a failure undoes only its own part.
        """
        own = self._own()
        if own is not None:
            with self._translated(), own.transaction():
                yield Connection(own)
            return
        with self._writer, self._translated(), self._pool.connection() as db, db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITER_LOCK,))
            if self.fence is not None:
                self.fence(Connection(db))
            self._writing = (threading.get_ident(), db)
            try:
                yield Connection(db)
            finally:
                self._writing = None

    def grouped(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in a write transaction that it may share with other callers' work: one
        commit, and so one WAL flush on the server, for all of them (`grouping.GroupCommit`)."""
        return self._group.run(work)

    def create(self, schema: str) -> None:
        """Create the tables of `schema` that do not exist yet (the trajectory ledger's), as the
        constructor creates the store's: under WRITER_LOCK, so servers starting at once do not
        race, and outside the fence, as a standby needs its tables too."""
        with self._translated(), self._pool.connection() as db, db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITER_LOCK,))
            db.execute(schema)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until `predicate` holds, the database closes, or `timeout` passes; `predicate`
        is asked again after every notification on EVENTS_CHANNEL, and once more at the end."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self._notifications  # before asking: a notification after this ends the wait
            if self.closed or predicate():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._changed:
                if self._notifications == seen:
                    self._changed.wait(remaining)

    def _wake(self) -> None:
        with self._changed:
            self._notifications += 1
            self._changed.notify_all()

    def _listen(self) -> None:
        """Wake the watchers on every notification, on a connection of its own, reconnecting
        while the database is open."""
        while not self.closed:
            try:
                with self._connect() as db:
                    db.execute(f"LISTEN {EVENTS_CHANNEL}")
                    self._wake()  # for anything committed while nobody listened
                    while not self.closed:
                        for _ in db.notifies(timeout=LISTEN_POLL_S):
                            self._wake()
            except psycopg.OperationalError as exc:
                log.warning(
                    "lost the event listener of the state database %s: %s", self.where, self._told(exc)
                )
                self._closing.wait(RELISTEN_S)


def _build_indexes(db: _Pooled, indexes: Sequence[tuple[str, str]]) -> None:
    """Build each index that is missing, or that a build cut short left invalid, CONCURRENTLY: an
    orchestrator serving the database meanwhile goes on writing, where a plain CREATE INDEX would
    hold its writes until the index is built (minutes on millions of episodes). One server builds
    at a time (INDEX_LOCK), so none takes an index another is building for one left invalid."""
    db.execute("SELECT pg_advisory_lock(%s, %s)", INDEX_LOCK)
    try:
        for name, definition in indexes:
            found = db.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)
            ).fetchone()
            if found is not None and found["indisvalid"]:
                continue
            if found is not None:
                log.warning("index %s was left invalid by a build cut short; building it again", name)
                db.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            log.info("building index %s of the state database", name)
            db.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}")
    finally:
        db.execute("SELECT pg_advisory_unlock(%s, %s)", INDEX_LOCK)


def _durable(db: _Pooled) -> None:
    """A commit that returned is on disk, as with SQLite's synchronous=FULL, even where the
    server's default is synchronous_commit=off; a stricter setting (remote_apply) is kept."""
    db.execute(
        "SELECT set_config('synchronous_commit', 'on', false)"
        " WHERE current_setting('synchronous_commit') = 'off'"
    )


LEADER_LOCK = (0x5354_4153, 0x4C45_4144)  # "STAS", "LEAD"
"""Key of the session advisory lock the leading orchestrator holds (two int4 halves, so it shows
in pg_locks as classid, objid with objsubid 2)."""
SERVER_KEEPALIVE = (
    "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3;"
    " SET tcp_user_timeout = 5000"
)
"""The server's TCP settings on the lease's session: it ends the session of a leader whose host
or link went silent, and so frees the lock, about 7 s after it last heard from it (a first
probe after 5 s idle; the next, 2 s on, finds 5 s passed unanswered), or 5 s after a reply it
sent went unacknowledged, instead of the kernel's two hours. The leader's own connection gives up
sooner (`LINK`): it stops leading before a standby can take the lease."""


class PostgresLease:
    """Leadership as a session advisory lock on a connection of its own (see `state.lease`).

    The lock lives as long as that session: a leader that dies, or whose connection drops, loses
    it at once, and a standby's next `try_acquire` takes it. It also fences the database: every
    write transaction first checks, under the writer lock, that this lease's session still
    holds the lock and that the stored term is still the one it took, and refuses otherwise
    (StandingBy). A leader that lost the lease and has not
    noticed yet can therefore change nothing, and a new leader reads all its predecessor wrote.
    """

    def __init__(self, database: PostgresDatabase, holder: str) -> None:
        self._database = database
        self.holder = holder
        self._conn: _Pooled | None = None
        self._pid: int | None = None
        """The backend pid of the session holding the lock; None while not leading."""
        self.term = 0
        """How many times the lease has been taken, counting this one, while leading."""
        self._lock = threading.Lock()
        database.fence = self._fence

    def try_acquire(self) -> bool:
        with self._lock, self._database._translated():
            if self._pid is not None:
                return True
            if self._conn is None or self._conn.closed:
                self._conn = self._database._connect()
                self._conn.execute(SERVER_KEEPALIVE)
                _durable(self._conn)
            row = self._conn.execute(
                "SELECT pg_try_advisory_lock(%s, %s) AS taken, pg_backend_pid() AS pid", LEADER_LOCK
            ).fetchone()
            if not row or not row["taken"]:
                return False
            # Written on the lease's own session, which alone may change the row while it holds
            # the lock; the fence then admits writes of this term only.
            taken = self._conn.execute(
                "INSERT INTO leader (lease, holder, since, term) VALUES (1, %s, %s, 1) ON CONFLICT (lease)"
                " DO UPDATE SET holder = EXCLUDED.holder, since = EXCLUDED.since, term = leader.term + 1"
                " RETURNING term",
                (self.holder, time.time()),
            ).fetchone()
            self.term = int(taken["term"]) if taken else 0
            self._pid = int(row["pid"])
        return True

    def held(self) -> bool:
        with self._lock:
            if self._pid is None or self._conn is None:
                return False
            try:
                self._conn.execute("SELECT 1")
                return True
            except psycopg.Error as exc:
                log.error(
                    "lost the leader's connection to %s: %s", self._database.where, self._database._told(exc)
                )
                self._lapse()
                return False

    def leader(self) -> str:
        try:
            with self._database.read() as db:
                row = db.execute("SELECT holder, since, term FROM leader WHERE lease = 1").fetchone()
        except TemporaryError:
            return "unknown (the state database is unavailable)"
        if row is None:
            return "nobody yet"
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row["since"]))
        return f"{row['holder']} (term {row['term']}, since {since})"

    def release(self) -> None:
        with self._lock:
            self._lapse()

    def _lapse(self) -> None:
        self._pid = None
        if self._conn is not None:
            self._conn.close()  # the server frees the lock with the session
            self._conn = None

    def _fence(self, db: Connection) -> None:
        """Refuse the write unless this lease's session holds the lock and the term is still
        the one it took: a backend pid is reused, and a later leader's session may get it."""
        pid, term = self._pid, self.term
        if (
            pid is not None
            and db.execute(
                "SELECT 1 FROM pg_locks, leader WHERE locktype = 'advisory' AND classid = ? AND objid = ?"
                " AND objsubid = 2 AND pid = ? AND granted AND lease = 1 AND term = ?",
                (*LEADER_LOCK, pid, term),
            ).fetchone()
        ):
            return
        raise standing_by(self)
