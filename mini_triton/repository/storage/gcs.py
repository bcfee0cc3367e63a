"""Google Cloud Storage, through google-cloud-storage (the `gs` extra)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .common import access_denied, missing_client, missing_container, unreadable
from .mirror import RemoteObject


class GcsStore:
    """Google Cloud Storage through google-cloud-storage (the `gs` extra). Credentials
    as Triton: GOOGLE_APPLICATION_CREDENTIALS, else the attached service account
    (application default credentials), else anonymous (a public bucket).
    STORAGE_EMULATOR_HOST points the client at an emulator."""

    container_word = "bucket"

    def __init__(self, url: str, bucket: str):
        try:
            from google.cloud import storage  # noqa: F401
        except ImportError:
            raise missing_client("gs", "google-cloud-storage") from None
        self.url = url
        self.container = bucket
        self._bucket = None
        self.anonymous = False

    def bucket(self):
        if self._bucket is None:
            from google.auth.exceptions import DefaultCredentialsError
            from google.cloud import storage

            with self._errors():
                try:
                    client = storage.Client()
                except DefaultCredentialsError:
                    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
                        raise
                    client = storage.Client.create_anonymous_client()
                    self.anonymous = True
                self._bucket = client.bucket(self.container)
        return self._bucket

    @staticmethod
    def _limits() -> dict:
        """Bounded retries: an endpoint that does not answer is an error in seconds, not
        after the client's default two minutes."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        return {"timeout": (10, 60), "retry": DEFAULT_RETRY.with_timeout(10)}

    def check(self, prefix: str) -> bool:
        with self._errors():
            blobs = self.bucket().list_blobs(prefix=prefix, max_results=1, **self._limits())
            return any(True for _ in blobs)

    def list(self, prefix: str) -> list[RemoteObject]:
        with self._errors():
            return [RemoteObject(blob.name, str(blob.generation), int(blob.size or 0))
                    for blob in self.bucket().list_blobs(prefix=prefix, **self._limits())]

    def download(self, obj: RemoteObject, destination: Path) -> str:
        with self._errors(obj.key):
            generation = int(obj.token) if obj.token.isdigit() else None
            blob = self.bucket().blob(obj.key, generation=generation)
            with open(destination, "xb") as handle:
                blob.download_to_file(handle, **self._limits())
            return obj.token

    @contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        try:
            yield
        except api.NotFound as error:
            if key is None:
                raise unreadable(self.url, key, missing_container(self, error.message)) \
                    from None
            raise unreadable(self.url, key, error.message) from None
        except (api.Forbidden, api.Unauthorized, auth.GoogleAuthError) as error:
            raise unreadable(self.url, key, access_denied(
                self.anonymous, "GOOGLE_APPLICATION_CREDENTIALS", str(error))) from None
        except api.RetryError as error:  # what the retries end in when nothing answers
            raise unreadable(self.url, key, f"not reachable: {error}") from None
        except api.GoogleAPIError as error:
            raise unreadable(self.url, key, str(error)) from None
        except (ConnectionError, OSError) as error:
            raise unreadable(self.url, key, f"not reachable: {error}") from None
        except Exception as error:  # requests' connection errors and the like
            if type(error).__module__.startswith(("requests", "urllib3", "google")):
                raise unreadable(self.url, key, f"{type(error).__name__}: {error}") from None
            raise
