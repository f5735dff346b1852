"""The config's JSON Schema (``ingest config-schema``), generated from the sections.

Editors that read JSON Schema for TOML (Taplo, Even Better TOML) validate and complete
``conf/*.toml`` with it; ``docs/configuration.md`` is written from it (``docs.py``).
Sizes and durations are a number or a string with a unit (``units.py`` gives their
patterns), so the schema takes what the loader takes. TOML has no null: a key whose
default is unset is simply left out, so the schema offers no ``null``.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from ingest.config.sections import IngestConfig


class _TomlSchema(GenerateJsonSchema):
    def generate_inner(self, schema: Any) -> JsonSchemaValue:  # a core schema or a field
        json_schema = super().generate_inner(schema)
        # A bound on a Size or a Duration (a plain validator) comes as the constraint's name.
        for constraint, keyword in (("ge", "minimum"), ("gt", "exclusiveMinimum")):
            if constraint in json_schema:
                json_schema[keyword] = json_schema.pop(constraint)
        return json_schema

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        # pydantic leaves out a default_factory's default; a list's or a table's is shown
        # (a section's is its own keys' defaults).
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            value = factory()  # type: ignore[call-arg]
            if isinstance(value, list | dict):
                schema = {**schema, "default": value}
                del schema["default_factory"]
        json_schema = super().default_schema(schema)
        if json_schema.get("default", ...) is None:
            del json_schema["default"]
        return json_schema


def config_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config file."""
    schema = TypeAdapter(IngestConfig).json_schema(schema_generator=_TomlSchema)
    return {"$schema": _TomlSchema.schema_dialect, **schema}
