"""dlqapp's settings: `Settings.from_env()`, the Kafka connection settings, their parsers."""

from dlqapp.settings.model import SETTINGS, Settings, SettingsError, markdown_table
from dlqapp.settings.parsing import format_duration, parse_duration_ms

__all__ = ["SETTINGS", "Settings", "SettingsError", "format_duration", "markdown_table", "parse_duration_ms"]
