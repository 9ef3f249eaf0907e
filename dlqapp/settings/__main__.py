"""`python -m dlqapp.settings` prints the settings table of docs/settings.md."""

from dlqapp.settings.model import markdown_table

print(markdown_table())
