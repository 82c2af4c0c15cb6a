"""S3-compatible backend: the only module that touches boto3, and where its errors become ours."""

from __future__ import annotations

import contextlib
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import boto3
import boto3.s3.transfer
import botocore.config
import botocore.exceptions
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from ._backends import ObjectMissing
from ._errors import StoreError, StoreRejected, StoreUnavailable
from ._layout import probe_key
from ._settings import StoreSettings

T = TypeVar("T")

_THROTTLING = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        # AWS answers 409 when two conditional writes race; the retry then sees 412.
        "ConditionalRequestConflict",
        "OperationAborted",
    }
)
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
_DELETE_BATCH = 1000  # DeleteObjects accepts at most 1000 keys per request.


def _status(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        return _status(exc) >= 500 or _status(exc) == 429 or _code(exc) in _THROTTLING
    return isinstance(
        exc,
        botocore.exceptions.ConnectionError
        | botocore.exceptions.HTTPClientError
        | botocore.exceptions.IncompleteReadError,
    )


class S3Backend:
    """Objects under ``prefix/`` in one bucket; every request retried on transient failures."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        endpoint: str | None,
        region: str | None,
        settings: StoreSettings,
    ) -> None:
        self._bucket = bucket
        self._prefix = f"{prefix}/" if prefix else ""
        self._endpoint = endpoint
        self._exclusive_create_checked = False
        self._probing = threading.Lock()
        config = botocore.config.Config(
            # tenacity below owns retries, so that the policy lives in one place.
            retries={"total_max_attempts": 1, "mode": "standard"},
            # Chunk workers plus lock refreshes and manifest reads never wait for a connection.
            max_pool_connections=settings.threads_for(remote=True) + 4,
            connect_timeout=settings.s3_timeout_s,
            read_timeout=settings.s3_timeout_s,
            s3={"addressing_style": "path"} if endpoint else {},
        )
        self._client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name=region or "us-east-1", config=config
        )
        self._transfer = boto3.s3.transfer.TransferConfig(
            multipart_threshold=64 << 20,
            multipart_chunksize=16 << 20,
            max_concurrency=settings.threads_for(remote=True),
        )
        retry = settings.retry
        self._retrying = Retrying(
            stop=stop_after_attempt(retry.attempts),
            wait=wait_exponential_jitter(
                multiplier=retry.initial_backoff_s, max=retry.max_backoff_s, jitter=retry.initial_backoff_s
            ),
            retry=retry_if_exception(_transient),
            reraise=True,
        )

    @property
    def remote(self) -> bool:
        return True

    @property
    def location(self) -> str:
        where = f"s3://{self._bucket}/{self._prefix}"
        return f"{where} at {self._endpoint}" if self._endpoint else where

    def _call(self, key: str | None, fn: Callable[[], T]) -> T:
        try:
            return self._retrying(fn)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _MISSING and key is not None:
                raise ObjectMissing(key) from None
            detail = f"{_code(exc) or 'error'} (HTTP {_status(exc)}): {exc}"
            if _transient(exc):
                raise StoreUnavailable(self.location, key, f"{detail}; gave up after retries") from None
            raise StoreRejected(self.location, key, detail) from None
        except botocore.exceptions.BotoCoreError as exc:
            if _transient(exc):
                raise StoreUnavailable(self.location, key, f"{exc}; gave up after retries") from None
            raise StoreRejected(self.location, key, str(exc)) from None

    def put(self, key: str, blob: bytes, *, durable: bool = True) -> None:
        self._call(
            key, lambda: self._client.put_object(Bucket=self._bucket, Key=self._prefix + key, Body=blob)
        )

    def put_if_absent(self, key: str, blob: bytes) -> bool:
        self.ensure_exclusive_create()
        return self._put_if_absent(key, blob)

    def ensure_exclusive_create(self) -> None:
        """Create a probe object twice with If-None-Match: *; an endpoint (or a proxy before it)
        that lets the second through would let two writers both publish one manifest."""
        with self._probing:
            if self._exclusive_create_checked:
                return
            key = probe_key(f"if-none-match-{uuid.uuid4().hex}")
            try:
                if not self._put_if_absent(key, b""):
                    raise StoreRejected(
                        self.location, key, "If-None-Match: * refused the create of a new object (412)"
                    )
                if self._put_if_absent(key, b""):
                    raise StoreRejected(
                        self.location,
                        key,
                        "the endpoint ignores If-None-Match: * (it replaced an existing object instead "
                        "of answering 412), so it cannot keep two writers from publishing one snapshot; "
                        "use an S3 endpoint that supports conditional writes",
                    )
            finally:
                with contextlib.suppress(StoreError):  # An empty object left over harms nothing.
                    self.delete([key])
            self._exclusive_create_checked = True

    def _put_if_absent(self, key: str, blob: bytes) -> bool:
        def attempt() -> bool:
            try:
                self._client.put_object(
                    Bucket=self._bucket, Key=self._prefix + key, Body=blob, IfNoneMatch="*"
                )
            except botocore.exceptions.ClientError as exc:
                if _status(exc) == 412 or _code(exc) == "PreconditionFailed":
                    return False
                raise
            return True

        return self._call(key, attempt)

    def get(self, key: str) -> bytes:
        def attempt() -> bytes:
            # Reading the body sits inside the retried call: a connection cut mid-body retries too.
            body: bytes = self._client.get_object(Bucket=self._bucket, Key=self._prefix + key)["Body"].read()
            return body

        return self._call(key, attempt)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        def attempt() -> bytes:
            span = f"bytes={offset}-{offset + length - 1}"
            body: bytes = self._client.get_object(Bucket=self._bucket, Key=self._prefix + key, Range=span)[
                "Body"
            ].read()
            return body

        return self._call(key, attempt)

    def writer(self, key: str) -> _S3Writer:
        return _S3Writer(self, key)

    def _upload(self, key: str, path: str) -> None:
        """One object from a local file, in parallel multipart pieces for a large one."""
        self._call(
            key,
            lambda: self._client.upload_file(path, self._bucket, self._prefix + key, Config=self._transfer),
        )

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            head: dict[str, Any] = self._call(
                key, lambda: self._client.head_object(Bucket=self._bucket, Key=self._prefix + key)
            )
            return head
        except ObjectMissing:
            return None

    def size(self, key: str) -> int | None:
        head = self._head(key)
        return None if head is None else int(head["ContentLength"])

    def list(self, prefix: str) -> Iterator[str]:
        return (key for key, _ in self.list_written(prefix))

    def list_written(self, prefix: str) -> Iterator[tuple[str, float]]:
        def attempt() -> list[tuple[str, float]]:
            found: list[tuple[str, float]] = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=self._prefix + prefix):
                found.extend(
                    (obj["Key"][len(self._prefix) :], obj["LastModified"].timestamp())
                    for obj in page.get("Contents", ())
                )
            return found

        return iter(self._call(prefix, attempt))

    def delete(self, keys: Iterable[str]) -> None:
        pending = list(keys)
        for start in range(0, len(pending), _DELETE_BATCH):
            batch = pending[start : start + _DELETE_BATCH]
            objects = [{"Key": self._prefix + k} for k in batch]

            def attempt(objects: list[dict[str, str]] = objects) -> dict[str, Any]:
                result: dict[str, Any] = self._client.delete_objects(
                    Bucket=self._bucket, Delete={"Objects": objects, "Quiet": True}
                )
                return result

            result = self._call(batch[0], attempt)
            errors = result.get("Errors") or []
            if errors:
                first = errors[0]
                raise StoreUnavailable(
                    self.location,
                    str(first.get("Key", ""))[len(self._prefix) :],
                    f"{len(errors)} deletes failed, first: {first.get('Code')}: {first.get('Message')}",
                )

    def flush(self) -> None:
        pass  # An acknowledged PUT is already durable.

    def discard_partial(self, older_than_s: float) -> int:
        return 0  # Single-request PUTs never leave partial objects behind.

    def close(self) -> None:
        self._client.close()


class _S3Writer:
    """A local spool file, uploaded as one object on commit (in parallel parts when large): an
    object in S3 appears whole or not at all."""

    def __init__(self, backend: S3Backend, key: str) -> None:
        self._backend, self._key = backend, key
        self._spool = tempfile.NamedTemporaryFile(prefix="stasis-pack-")  # noqa: SIM115 - closed below

    def write(self, data: bytes) -> None:
        self._spool.write(data)

    def commit(self) -> None:
        try:
            self._spool.flush()
            self._backend._upload(self._key, self._spool.name)
        finally:
            self._spool.close()

    def abort(self) -> None:
        self._spool.close()
