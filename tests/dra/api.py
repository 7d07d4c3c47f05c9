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


def _first_device(item: dict[str, Any]) -> tuple[int, str]:
    devices = item["spec"].get("devices") or [{"name": ""}]
    name = str(devices[0]["name"])
    number = name.rsplit("-", 1)[-1]
    return (int(number) if number.isdigit() else -1, name)


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
        # in the pool's order (slice names come from the API server: generateName)
        return sorted(items, key=_first_device)

    def wait_for_slices(self, driver: str, node: str, devices: int, timeout: int = 30) -> None:
        """Watch (no polling) until the pool's slices hold ``devices`` devices in all."""
        listing = self.call(
            "GET",
            f"{RESOURCE}/resourceslices",
            fieldSelector=f"spec.driver={driver},spec.nodeName={node}",
        )
        current = {s["metadata"]["name"]: s for s in listing["items"]}

        def count() -> int:
            return sum(len(s["spec"].get("devices") or []) for s in current.values())

        if count() == devices:
            return
        query = urlencode(
            {
                "watch": "1",
                "resourceVersion": listing["metadata"]["resourceVersion"],
                "fieldSelector": f"spec.driver={driver},spec.nodeName={node}",
                "timeoutSeconds": str(timeout),
            }
        )
        response = self.http.request(
            "GET",
            f"{self.server}{RESOURCE}/resourceslices?{query}",
            headers={"Authorization": f"Bearer {self.token}"},
            preload_content=False,
        )
        try:
            buffer = b""
            for chunk in response.stream(4096):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    event = json.loads(line)
                    name = event["object"]["metadata"]["name"]
                    if event["type"] == "DELETED":
                        current.pop(name, None)
                    else:
                        current[name] = event["object"]
                    if count() == devices:
                        return
        finally:
            response.release_conn()
        raise AssertionError(f"slices hold {count()} devices, not {devices}")
