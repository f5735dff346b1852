"""API version negotiation: per API, the highest version both sides support. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ingest.errors import UnsupportedVersionError
from ingest.protocol.codec import API_NAMES, SUPPORTED_VERSIONS

__all__ = ["NegotiatedApi", "Negotiation", "negotiate"]

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class NegotiatedApi:
    api_key: int
    name: str
    ours: Range
    broker: Range | None  # None: the broker does not offer the API
    chosen: int | None  # None: no version overlaps

    def row(self) -> str:
        broker = f"{self.broker[0]}-{self.broker[1]}" if self.broker else "-"
        chosen = str(self.chosen) if self.chosen is not None else "none"
        return f"{self.name:<16} {self.ours[0]}-{self.ours[1]:<5} {broker:<8} {chosen}"


@dataclass(frozen=True, slots=True)
class Negotiation:
    """The outcome of ApiVersions with one broker, for every API we implement."""

    apis: tuple[NegotiatedApi, ...]
    api_versions_version: int  # the ApiVersions version the broker answered

    def get(self, api_key: int) -> NegotiatedApi | None:
        for api in self.apis:
            if api.api_key == api_key:
                return api
        return None

    def speaks(self, api_key: int) -> bool:
        """Whether both sides have a version of ``api_key`` in common."""
        api = self.get(api_key)
        return api is not None and api.chosen is not None

    def version_for(self, api_key: int, *, broker: str = "the broker") -> int:
        """The version to use; UnsupportedVersionError names the API and both ranges."""
        api = self.get(api_key)
        if api is None:
            raise UnsupportedVersionError(f"api key {api_key} is not implemented by this client")
        if api.chosen is None:
            if api.broker is None:
                raise UnsupportedVersionError(
                    f"{broker} does not offer {api.name} (api key {api_key}); "
                    f"we implement versions {api.ours[0]}-{api.ours[1]}"
                )
            raise UnsupportedVersionError(
                f"no {api.name} version is supported by both sides: we implement "
                f"{api.ours[0]}-{api.ours[1]}, {broker} offers {api.broker[0]}-{api.broker[1]}"
            )
        return api.chosen

    def table(self) -> str:
        header = f"{'API':<16} {'ours':<7} {'broker':<8} chosen"
        return "\n".join([header, *(api.row() for api in self.apis)])


def negotiate(
    broker: Mapping[int, Range],
    *,
    ours: Mapping[int, Range] = SUPPORTED_VERSIONS,
    api_versions_version: int = 0,
) -> Negotiation:
    """Intersects our ranges with the broker's (``api_key -> (min, max)``)."""
    apis = []
    for api_key, (low, high) in sorted(ours.items()):
        theirs = broker.get(api_key)
        chosen: int | None = None
        if theirs is not None:
            top = min(high, theirs[1])
            if top >= max(low, theirs[0]):
                chosen = top
        apis.append(
            NegotiatedApi(
                api_key=api_key,
                name=API_NAMES.get(api_key, f"api{api_key}"),
                ours=(low, high),
                broker=theirs,
                chosen=chosen,
            )
        )
    return Negotiation(apis=tuple(apis), api_versions_version=api_versions_version)
