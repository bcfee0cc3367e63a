"""Azure Blob Storage, through azure-storage-blob (the `azure` extra)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .common import (INSTALL_HINT, StorageError, access_denied, missing_client,
                     missing_container, unreadable)
from .mirror import RemoteObject


class AzureStore:
    """Azure Blob Storage through azure-storage-blob (the `azure` extra). Credentials as
    Triton: AZURE_STORAGE_ACCOUNT (else the URL's account) with AZURE_STORAGE_KEY, or
    AZURE_STORAGE_AUTH_TYPE=managed_identity (AZURE_STORAGE_CLIENT_ID for a user-assigned
    identity; needs azure-identity); with neither, anonymous (a public container).
    AZURE_STORAGE_CONNECTION_STRING, when set, is used instead (its BlobEndpoint points
    the client at an emulator such as Azurite)."""

    container_word = "container"

    def __init__(self, url: str, account: str, container: str):
        try:
            from azure.storage.blob import BlobServiceClient  # noqa: F401
        except ImportError:
            raise missing_client("as", "azure-storage-blob") from None
        self.url = url
        self.account = account
        self.container = container
        self._client = None
        self.anonymous = False

    def client(self):
        if self._client is None:
            from azure.storage.blob import BlobServiceClient, LinearRetry

            options = dict(connection_timeout=10, read_timeout=60,
                           retry_policy=LinearRetry(backoff=1, random_jitter_range=0,
                                                    retry_total=2))
            with self._errors():
                connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
                if connection:
                    service = BlobServiceClient.from_connection_string(connection, **options)
                else:
                    account = os.environ.get("AZURE_STORAGE_ACCOUNT") or self.account
                    service = BlobServiceClient(f"https://{account}.blob.core.windows.net",
                                                credential=self._credential(account), **options)
                self._client = service.get_container_client(self.container)
        return self._client

    def _credential(self, account: str):
        key = os.environ.get("AZURE_STORAGE_KEY")
        auth_type = os.environ.get("AZURE_STORAGE_AUTH_TYPE", "key" if key else "")
        if auth_type == "managed_identity":
            try:
                from azure.identity import ManagedIdentityCredential
            except ImportError:
                raise StorageError("AZURE_STORAGE_AUTH_TYPE=managed_identity needs the "
                                   f"'azure-identity' package: {INSTALL_HINT['as']}") from None
            client_id = os.environ.get("AZURE_STORAGE_CLIENT_ID")
            return ManagedIdentityCredential(client_id=client_id) if client_id \
                else ManagedIdentityCredential()
        if key:
            return {"account_name": account, "account_key": key}
        self.anonymous = True
        return None

    def check(self, prefix: str) -> bool:
        with self._errors():
            pages = self.client().list_blobs(name_starts_with=prefix or None,
                                             results_per_page=1).by_page()
            return any(True for _ in next(pages, ()))

    def list(self, prefix: str) -> list[RemoteObject]:
        with self._errors():
            return [RemoteObject(blob.name, str(blob.etag), int(blob.size or 0))
                    for blob in self.client().list_blobs(name_starts_with=prefix or None)]

    def download(self, obj: RemoteObject, destination: Path) -> str:
        with self._errors(obj.key):
            stream = self.client().download_blob(obj.key)
            with open(destination, "xb") as handle:
                stream.readinto(handle)
            return str(stream.properties.etag or obj.token)

    @contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        from azure.core import exceptions as az

        variables = "AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY"
        try:
            yield
        except az.ResourceNotFoundError as error:
            if key is None:
                raise unreadable(self.url, key, missing_container(self, _azure_reason(error))) \
                    from None
            raise unreadable(self.url, key, _azure_reason(error)) from None
        except az.ClientAuthenticationError as error:
            raise unreadable(self.url, key, access_denied(
                self.anonymous, variables, _azure_reason(error))) from None
        except az.HttpResponseError as error:
            if error.status_code in (401, 403):
                raise unreadable(self.url, key, access_denied(
                    False, variables, _azure_reason(error))) from None
            raise unreadable(self.url, key, _azure_reason(error)) from None
        except (az.ServiceRequestError, az.ServiceResponseError) as error:
            raise unreadable(self.url, key, "endpoint not reachable: "
                             f"{_azure_reason(error)}") from None
        except az.AzureError as error:
            raise unreadable(self.url, key, str(error)) from None
        except ValueError as error:  # a malformed connection string or key
            raise unreadable(self.url, key, str(error)) from None


def _azure_reason(error) -> str:
    code = getattr(error, "error_code", None)
    code = getattr(code, "value", code)  # the SDK's StorageErrorCode enum, as the wire says it
    message = str(getattr(error, "reason", "") or error).splitlines()[0]
    return f"{code}: {message}" if code else message
