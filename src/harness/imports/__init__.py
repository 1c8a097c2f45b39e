"""Import of session files (pi, Claude Code, and harness's own export) into new sessions of the
journal, and the export that harness's own format round-trips."""

from harness.imports.claude_code import import_claude_code_session
from harness.imports.harness_jsonl import ExportReport, export_harness_session, import_harness_session
from harness.imports.pi import import_pi_session
from harness.imports.plan import ImportReport

__all__ = [
    "ExportReport",
    "ImportReport",
    "export_harness_session",
    "import_claude_code_session",
    "import_harness_session",
    "import_pi_session",
]
