"""A store in an S3 bucket (AWS S3 or any S3 API: MinIO, Ceph, moto's server) through boto3.

Credentials and region come from the standard AWS chain (environment, profile, instance role); the
endpoint from ``endpoint_url`` or ``AWS_ENDPOINT_URL``. Transient failures (connection refused, timeouts,
5xx, throttling) are retried by botocore with backoff; past that, a StoreError names the endpoint, bucket
and key, so "the store is down" reads as such.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from edgeplan.errors import StoreError, StoreKeyNotFound
from edgeplan.store.base import CHUNK, Store, check_key


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, retries: int | None = None,
                 timeout_s: float = 10.0, client=None):
        """``retries``: botocore's attempts per call (default 5, or $AWS_MAX_ATTEMPTS: a device that retries a
        whole pull on its own schedule may want 1)."""
        retries = retries or int(os.environ.get("AWS_MAX_ATTEMPTS", 5))
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = client or boto3.client(
            "s3", endpoint_url=self.endpoint_url,
            config=Config(retries={"max_attempts": retries, "mode": "standard"}, connect_timeout=timeout_s,
                          read_timeout=timeout_s, s3={"addressing_style": "path"}))

    @classmethod
    def from_uri(cls, uri: str, **options) -> S3Store:
        rest = uri[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise StoreError(f"store {uri!r}: no bucket; use s3://bucket/prefix")
        return cls(bucket, prefix, **options)

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, key: str = "") -> str:
        at = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"{self.uri}/{key}{at}" if key else f"{self.uri}{at}"

    def _fail(self, op: str, key: str, e: Exception) -> StoreError:
        if isinstance(e, ClientError):
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                return StoreKeyNotFound(f"{self._where()}: no object {key!r}")
            if code == "NoSuchBucket":
                return StoreError(f"{self._where()}: bucket {self.bucket!r} does not exist; create it first")
            return StoreError(f"{self._where(key)}: {op} refused ({code}: {e.response['Error'].get('Message', '')})")
        return StoreError(f"{self._where(key)}: {op} failed, the store is unreachable or failing after retries "
                          f"({type(e).__name__}: {e})")

    def get(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except (ClientError, BotoCoreError) as e:
            raise self._fail("read", key, e) from e

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **extra)
            return True
        except ClientError as e:
            if if_absent and e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412",
                                                                         "ConditionalRequestConflict"):
                return False
            raise self._fail("write", key, e) from e
        except BotoCoreError as e:
            raise self._fail("write", key, e) from e

    def size(self, key: str) -> int | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._fail("stat", key, e) from e
        except BotoCoreError as e:
            raise self._fail("stat", key, e) from e

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def list(self, prefix: str = "") -> list[str]:
        if prefix:
            check_key(prefix.rstrip("/"))
        full = (f"{self.prefix}/" if self.prefix else "") + prefix
        keys = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    k = obj["Key"]
                    keys.append(k[len(self.prefix) + 1:] if self.prefix else k)
        except (ClientError, BotoCoreError) as e:
            raise self._fail("list", prefix, e) from e
        return sorted(keys)

    def read_from(self, key: str, start: int, total: int) -> Iterator[bytes]:
        """One ranged GET for the rest of the object, read in CHUNK pieces (a GET per MB costs a request each on
        S3; moto's server builds the whole object for every ranged GET, so 143 MB in 1 MB ranges took it 10 s).
        A stream cut part-way leaves what arrived for ``download`` to resume from."""
        if start >= total:
            return
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key),
                                          Range=f"bytes={start}-{total - 1}")["Body"]
            yield from body.iter_chunks(CHUNK)
        except (ClientError, BotoCoreError) as e:
            raise self._fail("read", key, e) from e

    def read_range(self, key: str, start: int, end: int | None = None) -> bytes:
        rng = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key), Range=rng)["Body"].read()
        except (ClientError, BotoCoreError) as e:
            raise self._fail("read", key, e) from e
