"""Amazon S3 and S3-compatible stores, through boto3 (the `s3` extra)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .common import CHUNK, access_denied, missing_client, missing_container, unreadable
from .mirror import RemoteObject


class S3Store:
    """Amazon S3 or an S3-compatible store, through boto3 (the `s3` extra). Credentials
    and region come from boto3's usual chain, as tritonserver reads them: the
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN and
    AWS_DEFAULT_REGION variables first, then AWS_PROFILE and the ~/.aws files; with no
    credentials at all, requests go unsigned (a public bucket)."""

    container_word = "bucket"

    def __init__(self, url: str, bucket: str, endpoint: str | None):
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise missing_client("s3", "boto3") from None
        self.url = url
        self.container = bucket
        self.endpoint = endpoint
        self._client = None
        self.anonymous = False

    def client(self):
        if self._client is None:
            import boto3
            import botocore
            from botocore.config import Config

            with self._errors():
                session = boto3.session.Session()
                options = dict(connect_timeout=10, read_timeout=60,
                               retries={"max_attempts": 3, "mode": "standard"})
                if self.endpoint is not None:
                    options["s3"] = {"addressing_style": "path"}  # as Triton for host:port
                if session.get_credentials() is None:
                    options["signature_version"] = botocore.UNSIGNED
                    self.anonymous = True
                region = session.region_name or ("us-east-1" if self.endpoint else None)
                self._client = session.client("s3", endpoint_url=self.endpoint,
                                              region_name=region, config=Config(**options))
        return self._client

    def check(self, prefix: str) -> bool:
        with self._errors():
            reply = self.client().list_objects_v2(Bucket=self.container, Prefix=prefix,
                                                  MaxKeys=1)
            return bool(reply.get("KeyCount") or reply.get("Contents"))

    def list(self, prefix: str) -> list[RemoteObject]:
        with self._errors():
            paginator = self.client().get_paginator("list_objects_v2")
            return [RemoteObject(item["Key"], item.get("ETag", ""), int(item.get("Size", 0)))
                    for page in paginator.paginate(Bucket=self.container, Prefix=prefix)
                    for item in page.get("Contents", ())]

    def download(self, obj: RemoteObject, destination: Path) -> str:
        with self._errors(obj.key):
            reply = self.client().get_object(Bucket=self.container, Key=obj.key)
            with open(destination, "xb") as handle:
                for chunk in reply["Body"].iter_chunks(CHUNK):
                    handle.write(chunk)
            return reply.get("ETag", obj.token)

    @contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        from botocore import exceptions as boto

        try:
            yield
        except boto.ClientError as error:
            details = error.response.get("Error", {})
            code = str(details.get("Code", "")) or "error"
            reason = f"{code}: {details.get('Message') or str(error)}"
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchBucket",) or (status == 404 and key is None):
                raise unreadable(self.url, key, missing_container(self, reason)) from None
            if code in _S3_CREDENTIAL_CODES or status in (401, 403):
                raise unreadable(self.url, key, access_denied(
                    self.anonymous, "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                    "AWS_SESSION_TOKEN, AWS_PROFILE", reason)) from None
            raise unreadable(self.url, key, reason) from None
        except (boto.EndpointConnectionError, boto.ConnectTimeoutError,
                boto.ReadTimeoutError, boto.ConnectionClosedError) as error:
            raise unreadable(self.url, key, f"endpoint {self.endpoint or 'of Amazon S3'} "
                             f"not reachable: {error}") from None
        except boto.NoRegionError:
            raise unreadable(self.url, key, "no region (set AWS_DEFAULT_REGION)") from None
        except boto.BotoCoreError as error:
            raise unreadable(self.url, key, str(error)) from None

_S3_CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                        "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
                        "AuthorizationHeaderMalformed", "InvalidClientTokenId"}
