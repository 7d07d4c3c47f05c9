"""A test-side API server client (urllib3 + the kubeconfig's token), independent of the kit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml

RESOURCE = "/apis/resource.k8s.io/v1"


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        self.status = status
        super().__init__(f"{status}: {body[:500]}")


class Api:
    """Just enough of the API for the tests: JSON in, JSON out."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        self.server = cluster["server"]
        self.token = config["users"][0]["user"]["token"]
        self.http = urllib3.PoolManager(ca_certs=cluster["certificate-authority"])

    def call(self, method: str, path: str, body: Any = None, **query: str) -> Any:
        url = self.server + path
        if query:
            url += "?" + urlencode(query)
        response = self.http.request(
            method,
            url,
            body=None if body is None else json.dumps(body),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        text = response.data.decode()
        if response.status >= 300:
            raise ApiError(response.status, text)
        return json.loads(text) if text else None

    def slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        items = self.call(
            "GET",
            f"{RESOURCE}/resourceslices",
            fieldSelector=f"spec.driver={driver},spec.nodeName={node}",
        )["items"]
        return sorted(items, key=lambda s: s["metadata"]["name"])
